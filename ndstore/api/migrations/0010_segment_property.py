"""SegmentProperty: names, descriptions and tags of an annotation channel's labels (issue 49)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ndstore', '0009_channel_written_levels'),
    ]

    operations = [
        migrations.CreateModel(
            name='SegmentProperty',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('label', models.CharField(max_length=20)),
                ('name', models.CharField(blank=True, default='', max_length=256)),
                ('description', models.CharField(blank=True, default='', max_length=4096)),
                ('tags', models.JSONField(blank=True, default=list)),
                ('updated', models.DateTimeField(auto_now=True)),
                ('channel', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='segment_properties', to='ndstore.channel')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('channel', 'label'), name='unique_segment_label')],
            },
        ),
    ]
