"""URLconf of ``benchmarks/scale.py``'s admin timing: the admin site alone."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
