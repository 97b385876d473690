"""Channel.written_levels: which levels clients wrote (ndstore.api.levels). Channels that exist
already keep every level advertised, as before: what they hold above the base is unknown here."""

from django.db import migrations, models


def every_level_of_existing_channels(apps, schema_editor):  # type: ignore[no-untyped-def]
    Channel = apps.get_model("ndstore", "Channel")
    for chan in Channel.objects.select_related("experiment").iterator():
        chan.written_levels = (1 << max(1, chan.experiment.num_hierarchy_levels)) - 1
        chan.save(update_fields=["written_levels"])


class Migration(migrations.Migration):

    dependencies = [
        ('ndstore', '0008_audit_target'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='written_levels',
            field=models.PositiveBigIntegerField(default=1),
        ),
        migrations.RunPython(every_level_of_existing_channels, migrations.RunPython.noop),
    ]
