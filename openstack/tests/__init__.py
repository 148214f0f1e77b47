"""Tests of lifetime-alloc-openstack, run in the venv of scripts/openstack-env.sh:

    target/openstack/nova-venv/bin/python -m unittest discover -s openstack/tests -t openstack -v

``unit``: each module on its own (plain values, fakes, a local HTTP server); ``functional``: in
Nova's own functional harness (API, conductor, scheduler, computes on the fake driver, Placement)
with the project's three service binaries started from target/release.
"""

# Nova's harness runs under eventlet, patched before anything imports urllib3 or threading (as
# nova/tests/functional/__init__.py does); the unit tests run the same way.
from nova import monkey_patch  # noqa: E402
monkey_patch.patch()
