"""sessions_app's dashboard pages, one module per page group (sessions.py is a session's page
and chat); sessions_app/urls.py imports each module directly."""
