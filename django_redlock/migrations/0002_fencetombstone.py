from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_redlock", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="FenceTombstone",
            fields=[
                (
                    "key",
                    models.CharField(
                        help_text="SHA-256 of the model label and key values.",
                        max_length=64,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                (
                    "model",
                    models.CharField(
                        help_text="app_label.model of the deleted row.", max_length=255
                    ),
                ),
                (
                    "token",
                    models.BigIntegerField(
                        help_text="Highest fencing token that deleted this key."
                    ),
                ),
                (
                    "deleted_at",
                    models.DateTimeField(help_text="When the key was last deleted."),
                ),
            ],
            options={
                "verbose_name": "fence tombstone",
                "verbose_name_plural": "fence tombstones",
            },
        ),
    ]
