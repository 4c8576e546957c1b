"""What the tests need and users do not: fake stores (a Hugging Face hub, S3 through moto, a plain
HTTP server), the hub's example repos, and record functions that fail or wait on purpose. Kept
out of the installed package; ``tests/conftest.py`` puts this folder's parent on ``sys.path``."""
