from django.apps import AppConfig


class AgentMcpConfig(AppConfig):
    name = "agent_mcp"
    verbose_name = "MCP server"
