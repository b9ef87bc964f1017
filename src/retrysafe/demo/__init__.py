"""OrderHub: the demo orders-and-payments API (DESIGN section 5), on Starlette, FastAPI, Flask or
Django: ``retrysafe demo [--framework NAME]``. Needs ``retrysafe[demo]``.

One domain (:mod:`.domain`: validation, problems, the user, the knobs, where the data lives), one
data layer (``_async_hub.py``, its sync twin generated; ``_drivers.py``), a thin app per framework
(``app.py``, ``fastapi_app.py``, ``flask_app.py``, ``django_app/``) and the page
(``static/index.html``). Importing this package imports no framework.
"""
