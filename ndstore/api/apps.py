from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "ndstore.api"
    label = "ndstore"
    verbose_name = "NDStore"

    def ready(self) -> None:
        from ndstore.api import signals

        signals.connect()
