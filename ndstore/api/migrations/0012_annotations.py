"""Annotation layers, annotations and their related segments (issue 51, precomputed annotations)."""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ndstore', '0011_scoped_tokens'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='AnnotationLayer',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=64, validators=[django.core.validators.RegexValidator('\\A[A-Za-z0-9_][A-Za-z0-9_-]{0,63}\\Z', "names are 1-64 letters, digits, '_' or '-', not starting with '-'")])),
                ('description', models.CharField(blank=True, default='', max_length=4096)),
                ('annotation_type', models.CharField(choices=[('point', 'point'), ('line', 'line'), ('axis_aligned_bounding_box', 'axis_aligned_bounding_box'), ('ellipsoid', 'ellipsoid')], max_length=32)),
                ('properties', models.JSONField(blank=True, default=list)),
                ('relationships', models.JSONField(blank=True, default=list)),
                ('version', models.PositiveBigIntegerField(default=0)),
                ('creator', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('experiment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='annotation_layers', to='ndstore.experiment')),
                ('segmentation', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='annotation_layers', to='ndstore.channel')),
            ],
        ),
        migrations.CreateModel(
            name='Annotation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('aid', models.BigIntegerField()),
                ('ax', models.FloatField()),
                ('ay', models.FloatField()),
                ('az', models.FloatField()),
                ('bx', models.FloatField()),
                ('by', models.FloatField()),
                ('bz', models.FloatField()),
                ('lo_x', models.FloatField()),
                ('lo_y', models.FloatField()),
                ('lo_z', models.FloatField()),
                ('hi_x', models.FloatField()),
                ('hi_y', models.FloatField()),
                ('hi_z', models.FloatField()),
                ('record', models.BinaryField()),
                ('layer', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='annotations', to='ndstore.annotationlayer')),
            ],
        ),
        migrations.CreateModel(
            name='AnnotationSegment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('relationship', models.PositiveSmallIntegerField()),
                ('segment', models.BigIntegerField()),
                ('aid', models.BigIntegerField()),
                ('layer', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='ndstore.annotationlayer')),
            ],
        ),
        migrations.AddConstraint(
            model_name='annotationlayer',
            constraint=models.UniqueConstraint(fields=('experiment', 'name'), name='unique_annotation_layer_name'),
        ),
        migrations.AddConstraint(
            model_name='annotation',
            constraint=models.UniqueConstraint(fields=('layer', 'aid'), name='unique_annotation_id'),
        ),
        migrations.AddIndex(
            model_name='annotationsegment',
            index=models.Index(fields=['layer', 'relationship', 'segment'], name='annotation_segment_lookup'),
        ),
        migrations.AddIndex(
            model_name='annotationsegment',
            index=models.Index(fields=['layer', 'aid'], name='annotation_segment_of'),
        ),
    ]
