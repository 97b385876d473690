"""The Django app: models, serializers, parsers/renderers per media type, and thin views."""
