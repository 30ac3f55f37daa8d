"""Optional integrations with other libraries; the core of django-redlock imports none of them."""
