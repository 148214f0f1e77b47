"""lifetime-alloc-openstack: OpenStack Nova places its servers through the lifetime-aware allocator.

- :mod:`lifetime_alloc_openstack.weigher`: the scheduler weigher (``LifetimeWeigher``);
- :mod:`lifetime_alloc_openstack.listener`: Nova's versioned notifications into the allocator's
  records (``lifetime-alloc-nova-listener``);
- :mod:`lifetime_alloc_openstack.reconcile`: the allocator made equal to Placement
  (``lifetime-alloc-nova-reconcile``);
- :mod:`lifetime_alloc_openstack.conf`: the ``[lifetime_alloc]`` options of nova.conf;
- :mod:`lifetime_alloc_openstack.mapping`, :mod:`lifetime_alloc_openstack.client`: the shapes and
  the HTTP client they share.

See docs/openstack.md of the repository.
"""

__version__ = '0.1.0'
