"""Two real services using cronlock: a FastAPI app and an aiohttp app (see README.md here).

Run them from the repository root, where ``examples`` is importable as a package.
"""
