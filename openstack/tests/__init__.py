"""Tests of lifetime-alloc-openstack, run in the venvs of scripts/openstack-env.sh:

    target/openstack/nova-venv/bin/python -m unittest discover -s openstack/tests -t openstack -v
    target/openstack/watcher-venv/bin/python -m unittest discover -s openstack/tests/watcher -t openstack -v

``unit``: each module on its own (plain values, fakes, a local HTTP server); ``functional``: in
Nova's own functional harness (API, conductor, scheduler, computes on the fake driver, Placement)
with the project's three service binaries started from target/release; ``watcher``: the Watcher
strategy in Watcher's own functional harness (its API, decision engine and applier against its
emulated Nova and Placement), with the allocator binary (the Nova venv skips it).
"""

try:
    from nova import monkey_patch
except ImportError:
    # Watcher's venv: Watcher's test package sets eventlet up; it must come before any other
    # Watcher module (as Watcher's own tests import it).
    import watcher.tests.unit  # noqa: F401
else:
    # Nova's harness runs under eventlet, patched before anything imports urllib3 or threading
    # (as nova/tests/functional/__init__.py does); the unit tests run the same way.
    monkey_patch.patch()
