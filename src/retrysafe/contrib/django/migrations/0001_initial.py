"""The record table of the Django ORM store."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="IdempotencyRecord",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("fingerprint", models.TextField()),
                ("state", models.SmallIntegerField()),
                ("token", models.TextField(null=True)),
                ("lease_expires_at", models.FloatField()),
                ("expires_at", models.FloatField(db_index=True)),
                ("created_at", models.FloatField()),
                ("route", models.TextField(default="")),
                ("response", models.BinaryField(null=True)),
            ],
            options={
                "verbose_name": "idempotency record",
                "db_table": "retrysafe_record",
            },
        ),
    ]
