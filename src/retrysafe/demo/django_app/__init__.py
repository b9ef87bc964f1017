"""OrderHub on Django: the same HTTP contract as the Starlette OrderHub (DESIGN section 5), with
orders and payments written through the Django ORM and committed together with the idempotency
record (the ``django`` store, transactional). ``retrysafe demo --framework django``."""
