"""sessions_app's dashboard pages, one module per page group: a session's page and chat
(sessions.py, with entries.py for the conversation as shown and panel.py for the
introspection panel), starting and managing sessions (lifecycle.py), the activity pages
(activity.py) and the kins (kins.py). sessions_app/urls.py imports each module directly."""
