from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "ndstore.api"
    label = "ndstore"
    verbose_name = "NDStore"
