"""The Python client and the `ndstore` command line."""
