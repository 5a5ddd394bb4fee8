"""The owner console (``/console``) and the offline API docs (``/docs``).

A static page and its scripts, served by the service: the page signs in with the principal's API
key and calls the same public HTTP API as every other client; nothing here reads the database.
Third-party browser assets (Chart.js, Swagger UI) are vendored under ``static/vendor`` and served
locally, never from a CDN.
"""
