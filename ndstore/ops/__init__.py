"""What runs the service (not what its users import): the local stack's supervisor (`ndstore
up`), its daemons' entry points, moto's endpoint for the tests, and the server-side commands of
the `ndstore` CLI."""
