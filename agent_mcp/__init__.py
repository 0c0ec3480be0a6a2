"""The MCP server (Model Context Protocol) at /mcp/: Kinsite's memories, history, facts,
experience, prompt preview, lineage and chat turns as tools for agents in IDEs and desktop
assistants, with the API's Bearer tokens and team scoping (views.py, server.py, tools.py)."""
