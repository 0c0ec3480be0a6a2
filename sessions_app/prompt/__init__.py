"""The prompt of a chat turn: its database reads, pure sections, history selection and their assembly (assembly.py)."""
