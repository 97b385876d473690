"""Scoped tokens: a level cap, a resource, an expiry and the token that minted it (issue 51)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ndstore', '0010_segment_property'),
    ]

    operations = [
        migrations.AddField(
            model_name='apitoken',
            name='channel',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ndstore.channel'),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='collection',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ndstore.collection'),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='experiment',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ndstore.experiment'),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='expires',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='level',
            field=models.CharField(blank=True, choices=[('read', 'read'), ('write', 'write')], default='', max_length=8),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='parent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ndstore.apitoken'),
        ),
    ]
