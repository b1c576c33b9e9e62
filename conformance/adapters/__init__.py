"""Backend adapters: ``backend_<name>.make_backend()`` for each name in ``conftest.BACKENDS``."""
