"""Settings: base (shared), test, production. DJANGO_SETTINGS_MODULE picks one."""
