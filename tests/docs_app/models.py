"""The models the docs' examples use without defining them."""

from __future__ import annotations

from django.db import models

from django_redlock.models import FencedModel


class Product(FencedModel):
    """``stock``, and an optional unique ``sku`` (docs/fencedmodel.md, tombstones)."""

    # NULL, not "": many rows without a SKU under a unique constraint
    sku = models.CharField(max_length=50, unique=True, null=True, default=None)  # noqa: DJ001
    stock = models.PositiveIntegerField(default=0)


class Order(FencedModel):
    product = models.ForeignKey(Product, on_delete=models.CASCADE, null=True, related_name="+")
    quantity = models.PositiveIntegerField(default=1)
    paid = models.BooleanField(default=False)


class Invoice(FencedModel):
    total = models.IntegerField(default=0)


class Report(FencedModel):
    day = models.CharField(max_length=10)
    body = models.TextField(default="")


class Export(FencedModel):
    tenant = models.IntegerField(default=0)
