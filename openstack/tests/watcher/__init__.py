"""The Watcher strategy's tests: run in Watcher's venv only (`scripts/openstack-env.sh --print
watcher`); in Nova's venv, which has no Watcher, discovery finds nothing here. The e2e driver sets
LIFETIME_ALLOC_REQUIRE_WATCHER=1, so that a venv without Watcher fails instead of running nothing.
"""

import importlib.util
import os


def load_tests(loader, standard_tests, pattern):
    if importlib.util.find_spec('watcher') is None:
        if os.environ.get('LIFETIME_ALLOC_REQUIRE_WATCHER') == '1':
            raise ImportError('python-watcher is not installed in this venv: use scripts/openstack-env.sh --print watcher')
        return standard_tests
    standard_tests.addTests(loader.discover(start_dir=os.path.dirname(__file__), pattern=pattern or 'test*.py'))
    return standard_tests
