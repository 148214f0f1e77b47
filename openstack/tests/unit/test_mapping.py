"""mapping: RequestSpec and notification payloads to VM requests, inventories to capacities."""

import unittest

from lifetime_alloc_openstack import mapping

UUID = '6f0c7f4e-8d8e-4a55-9d5c-2f5f3c1a0b11'
PROJECT = '6b2b9c8b1c8b4d6e9f0a1b2c3d4e5f60'


class FakeObject(object):
    """A Nova versioned object's reading surface: set fields, obj_attr_is_set."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def obj_attr_is_set(self, name):
        return name in self.__dict__


def flavor(**over):
    fields = dict(name='m1.small', vcpus=2, memory_mb=2048, root_gb=20, ephemeral_gb=0, swap=0,
                  extra_specs={})
    fields.update(over)
    return FakeObject(**fields)


def spec(**over):
    fields = dict(instance_uuid=UUID, project_id=PROJECT, flavor=flavor(), scheduler_hints={},
                  image=FakeObject(properties={'os_distro': 'ubuntu', 'hw_disk_bus': 'virtio'}),
                  is_bfv=False)
    fields.update(over)
    return FakeObject(**fields)


class RequestFromSpecTest(unittest.TestCase):

    def test_flavor_project_and_image_map_to_the_request(self):
        request, skipped = mapping.request_from_spec(spec(), 'zone-1', ['host1', 'host2'])
        self.assertEqual(skipped, [])
        self.assertEqual(request, {
            'vm_id': UUID, 'tenant_id': PROJECT, 'vm_type': 'm1.small', 'zone': 'zone-1',
            'demand': {'cores': 2.0, 'memory_gib': 2.0, 'ssd_gib': 20.0},
            'os': 'ubuntu', 'candidates': ['host1', 'host2'],
            'features': {'image.os_distro': 'ubuntu', 'image.hw_disk_bus': 'virtio'}})

    def test_nova_resources_win_over_the_flavor(self):
        request, _ = mapping.request_from_spec(
            spec(), 'zone-1', ['h'], resources={'PCPU': 4, 'MEMORY_MB': 3072, 'DISK_GB': 0})
        self.assertEqual(request['demand'], {'cores': 4.0, 'memory_gib': 3.0})

    def test_boot_from_volume_and_swap_count_as_nova_counts_them(self):
        request, _ = mapping.request_from_spec(
            spec(is_bfv=True, flavor=flavor(ephemeral_gb=5, swap=1500)), 'zone-1', ['h'])
        self.assertEqual(request['demand']['ssd_gib'], 7.0)  # 0 root + 5 + ceil(1500 / 1024)

    def test_the_lifetime_hint_is_the_lifetime_feature_and_hints_are_features(self):
        hints = {'lifetime': ['3600'], 'requested_at_s': ['864123.5'], 'priority': ['low'],
                 'batch': ['nightly'], 'group': ['abc'], '_nova_check_type': ['x'],
                 'many': ['a', 'b']}
        request, skipped = mapping.request_from_spec(spec(scheduler_hints=hints), 'z', ['h'])
        self.assertEqual(request['features']['lifetime'], 3600.0)
        self.assertEqual(request['features']['hint.batch'], 'nightly')
        self.assertEqual(request['requested_at_s'], 864123.5)
        self.assertEqual(request['priority'], 'low')
        self.assertNotIn('hint.group', request['features'])
        self.assertNotIn('hint._nova_check_type', request['features'])
        self.assertEqual(skipped, ['hint.many'])  # a list of two is no feature value

    def test_a_lifetime_hint_that_is_no_number_stays_a_text(self):
        request, _ = mapping.request_from_spec(
            spec(scheduler_hints={'lifetime': ['short']}), 'z', ['h'])
        self.assertEqual(request['features']['lifetime'], 'short')

    def test_at_most_64_features_texts_over_256_bytes_skipped(self):
        props = {'p%03d' % i: i for i in range(70)}
        props['long'] = 'x' * 300
        request, skipped = mapping.request_from_spec(
            spec(image=FakeObject(properties=props)), 'z', ['h'])
        self.assertEqual(len(request['features']), 64)
        self.assertIn('image.long', skipped)
        self.assertEqual(len(skipped), 71 - 64)
        request, _ = mapping.request_from_spec(
            spec(image=FakeObject(properties=props)), 'z', ['h'], max_features=3)
        self.assertEqual(len(request['features']), 3)

    def test_booleans_are_numbers_and_objects_are_skipped(self):
        props = {'hw_vif_multiqueue_enabled': True, 'img_config': {'a': 1}}
        request, skipped = mapping.request_from_spec(
            spec(image=FakeObject(properties=props)), 'z', ['h'])
        self.assertEqual(request['features'], {'image.hw_vif_multiqueue_enabled': 1.0})
        self.assertEqual(skipped, ['image.img_config'])

    def test_nova_image_meta_props_are_read_through_their_primitive(self):
        class Props(object):
            def obj_to_primitive(self):
                return {'nova_object.data': {'os_type': 'linux'}}
        request, _ = mapping.request_from_spec(spec(image=FakeObject(properties=Props())), 'z', ['h'])
        self.assertEqual(request['os'], 'linux')

    def test_missing_project_flavor_or_bad_ids_are_mapping_errors(self):
        cases = [
            (spec(project_id=None), 'no project'),
            (spec(project_id='has space'), 'the project id'),
            (spec(flavor=None), 'no flavor'),
            (spec(flavor=flavor(vcpus=0)), 'cores'),
            (spec(flavor=flavor(name='')), 'flavor name'),
            (spec(flavor=flavor(name='bad\nname')), 'control character'),
            (spec(instance_uuid='-x'), 'instance uuid'),
        ]
        for bad, words in cases:
            with self.assertRaises(mapping.MappingError) as caught:
                mapping.request_from_spec(bad, 'z', ['h'])
            self.assertIn(words, caught.exception.reason)

    def test_unset_fields_of_a_versioned_object_read_as_missing(self):
        bare = spec()
        del bare.__dict__['project_id']
        with self.assertRaises(mapping.MappingError):
            mapping.request_from_spec(bare, 'z', ['h'])

    def test_candidates_outside_the_id_charset_are_left_out(self):
        request, _ = mapping.request_from_spec(spec(), 'z', ['host 1', 'host2', None])
        self.assertEqual(request['candidates'], ['host2'])
        with self.assertRaises(mapping.MappingError):
            mapping.request_from_spec(spec(), 'z', ['host 1'])

    def test_moves_are_told_by_the_check_type_hint_or_ignored_hosts(self):
        self.assertFalse(mapping.is_move(spec()))
        self.assertTrue(mapping.is_move(spec(scheduler_hints={'_nova_check_type': ['rebuild']})))
        self.assertTrue(mapping.is_move(spec(ignore_hosts=['host1'])))


def payload(**over):
    data = {'uuid': UUID, 'tenant_id': PROJECT, 'host': 'compute-1', 'node': 'node-1',
            'launched_at': '2026-12-07T14:30:08Z', 'terminated_at': None,
            'metadata': {'lifetime': '7200', 'owner': 'batch', 'requested_at_s': '100'},
            'flavor': {'nova_object.data': {'name': 'm1.tiny', 'vcpus': 1, 'memory_mb': 512,
                                            'root_gb': 1, 'ephemeral_gb': 0, 'swap': 0}}}
    data.update(over)
    return {'nova_object.name': 'InstanceCreatePayload', 'nova_object.data': data}


class PayloadTest(unittest.TestCase):

    def test_a_create_payload_maps_to_the_request_and_its_node(self):
        data = mapping.payload_data(payload())
        self.assertEqual(mapping.host_of_payload(data), 'node-1')
        request = mapping.request_from_payload(data, 'zone-1')
        self.assertEqual(request, {
            'vm_id': UUID, 'tenant_id': PROJECT, 'vm_type': 'm1.tiny', 'zone': 'zone-1',
            'demand': {'cores': 1.0, 'memory_gib': 0.5, 'ssd_gib': 1.0},
            'requested_at_s': 100.0,
            'features': {'lifetime': 7200.0, 'meta.owner': 'batch'}})

    def test_launched_at_is_the_request_time_when_times_are_sent(self):
        data = mapping.payload_data(payload(metadata={}))
        self.assertEqual(mapping.request_from_payload(data, 'z')['requested_at_s'],
                         mapping.parse_time('2026-12-07T14:30:08+00:00'))
        self.assertNotIn('requested_at_s', mapping.request_from_payload(data, 'z', send_times=False))

    def test_the_host_when_no_node_and_none_when_neither(self):
        self.assertEqual(mapping.host_of_payload({'host': 'h', 'node': None}), 'h')
        self.assertIsNone(mapping.host_of_payload({'host': None, 'node': None}))

    def test_missing_tenant_or_flavor(self):
        with self.assertRaises(mapping.MappingError):
            mapping.request_from_payload(mapping.payload_data(payload(tenant_id=None)), 'z')
        with self.assertRaises(mapping.MappingError):
            mapping.request_from_payload(mapping.payload_data(payload(flavor=None)), 'z')

    def test_times_parse_in_the_forms_nova_and_oslo_write(self):
        self.assertEqual(mapping.parse_time('1970-01-01T00:01:00Z'), 60.0)
        self.assertEqual(mapping.parse_time('1970-01-01 00:01:00.500000'), 60.5)
        self.assertEqual(mapping.parse_time('1970-01-01T01:01:00+01:00'), 60.0)
        self.assertIsNone(mapping.parse_time('yesterday'))
        self.assertIsNone(mapping.parse_time(None))


class CapacityTest(unittest.TestCase):

    def test_usable_capacity_is_total_less_reserved_times_the_ratio(self):
        inv = {'VCPU': {'total': 2, 'reserved': 0, 'allocation_ratio': 4.0},
               'MEMORY_MB': {'total': 8192, 'reserved': 512, 'allocation_ratio': 1.5},
               'DISK_GB': {'total': 1028, 'reserved': 0, 'allocation_ratio': 1.0}}
        self.assertEqual(mapping.capacity_from_inventory(inv),
                         {'cores': 8.0, 'memory_gib': 11.25, 'ssd_gib': 1028.0})

    def test_ratios_are_rounded_down_to_base_units(self):
        inv = {'VCPU': {'total': 3, 'reserved': 0, 'allocation_ratio': 1.3333333},
               'MEMORY_MB': {'total': 1000, 'reserved': 0, 'allocation_ratio': 1.0}}
        self.assertEqual(mapping.capacity_from_inventory(inv), {'cores': 3.999, 'memory_gib': 1000 / 1024.0})

    def test_a_provider_without_compute_inventory_is_no_host(self):
        self.assertIsNone(mapping.capacity_from_inventory({'DISK_GB': {'total': 10}}))

    def test_base_units_compare_exactly(self):
        self.assertEqual(mapping.base_units({'cores': 1.5, 'memory_gib': 0.5}), (1500, 512, 0))
        self.assertEqual(mapping.demand_from_resources({'VCPU': 1, 'MEMORY_MB': 512, 'DISK_GB': 1}),
                         {'cores': 1.0, 'memory_gib': 0.5, 'ssd_gib': 1.0})


if __name__ == '__main__':
    unittest.main()
