from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ndstore", "0007_name_validator_anchors_with_z")]

    operations = [
        migrations.AddField(model_name="auditentry", name="target", field=models.JSONField(blank=True, null=True)),
        migrations.AlterField(model_name="auditentry", name="status", field=models.PositiveSmallIntegerField(null=True)),
    ]
