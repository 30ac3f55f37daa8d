from __future__ import annotations

from django.urls import URLPattern, path

from . import views

urlpatterns: list[URLPattern] = [
    path("buy/<int:product_id>/", views.buy, name="buy"),
    path("order/<int:product_id>/", views.order, name="order"),
    path("order-async/<int:product_id>/", views.order_async, name="order-async"),
    path("pay/<slug:payment_id>/", views.pay, name="pay"),
    path("stock/", views.stock, name="stock"),
]
