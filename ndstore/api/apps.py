from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "ndstore.api"
    label = "ndstore"
    verbose_name = "NDStore"

    def ready(self) -> None:
        from ndstore.api import ingest_leaves, signals

        signals.connect()  # first: the metadata generation advances before ingest_leaves reads levels
        ingest_leaves.connect()
