"""Django's Redis cache backend with one redis-py client per connection pool. Django's own
makes a new redis.Redis for every cache call, and each one copies redis-py's ~200 reply
callbacks into a case-insensitive dict: a chat turn makes three cache calls (the token
cache's generation, the rate limit's read and write), so that was a measurable part of
an API request (bench/README.md, "Request cost"). A redis.Redis takes a connection from
its pool for each command and gives it back, so one client can serve every call."""
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache, RedisCacheClient


class _OneClientPerPool(RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}  # id of the connection pool -> its client; the pools live as long as this

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = _OneClientPerPool
