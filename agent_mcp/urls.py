from django.urls import path

from agent_mcp.views import mcp_endpoint

urlpatterns = [
    path("", mcp_endpoint, name="mcp"),
]
