"""Topic names as Pulsar's TopicName reads them: short and full forms, domains, partitions, and
the names it refuses (segment:// and topic:// names are in tests/scalable/test_naming.py)."""

import pytest

from pyengine.errors import InvalidTopicNameError
from pyengine.naming import TopicName, normalize_topic


@pytest.mark.parametrize("name, full", [
    ("x", "persistent://public/default/x"),                                  # a short name
    ("my-topic.v1", "persistent://public/default/my-topic.v1"),
    ("tenant/ns/x", "persistent://tenant/ns/x"),                             # tenant/namespace/topic
    ("persistent://tenant/ns/x", "persistent://tenant/ns/x"),                # full names stay as they are
    ("non-persistent://tenant/ns/x", "non-persistent://tenant/ns/x"),
    ("persistent://public/default/x-partition-2", "persistent://public/default/x-partition-2"),
])
def test_normalised_names(name, full):
    assert normalize_topic(name) == full
    assert str(TopicName.parse(name)) == full
    assert normalize_topic(full) == full                                     # idempotent


def test_parts_of_a_name():
    name = TopicName.parse("non-persistent://acme/orders/eu.sales")
    assert (name.domain, name.tenant, name.namespace, name.local_name) == ("non-persistent", "acme", "orders",
                                                                          "eu.sales")
    assert name.namespace_name == "acme/orders"
    assert TopicName.parse("x") == TopicName("persistent", "public", "default", "x")


@pytest.mark.parametrize("local", [
    "with space", "colon:and=equals", "percent%2Fescaped", "ünïcødé-名前", "a?b#c", "x-partition-", "-partition-3",
])
def test_v2_local_names_pulsar_accepts_keep_working(local):
    """Pulsar's V2 local name is whatever follows the third '/', as long as it has no '/'."""
    name = TopicName.parse(f"persistent://public/default/{local}")
    assert name.local_name == local
    assert TopicName.parse(f"public/default/{local}") == name


@pytest.mark.parametrize("local, index, base", [
    ("x-partition-0", 0, "x"),
    ("x-partition-17", 17, "x"),
    ("a-partition-1-partition-2", 2, "a-partition-1"),                      # the last suffix counts
    ("x-partition-2147483647", 2**31 - 1, "x"),                             # Java's Integer.MAX_VALUE
    ("x", -1, "x"),
    ("x-partition-", -1, "x-partition-"),
    ("x-partition--1", -1, "x-partition--1"),                                # negative: not a partition
    ("x-partition-01", -1, "x-partition-01"),                                # leading zero: Pulsar's -1 too
    ("x-partition-+1", -1, "x-partition-+1"),
    ("x-partition-2147483648", -1, "x-partition-2147483648"),                # past a Java int
    ("x-partition-1a", -1, "x-partition-1a"),
    ("x-partition-²", -1, "x-partition-²"),                                  # str.isdigit, but not a number
    ("x-partition-١", -1, "x-partition-١"),                                  # a non-ASCII digit
])
def test_partition_suffix(local, index, base):
    name = TopicName.parse(f"persistent://t/ns/{local}")
    assert name.partition_index == index
    assert str(name.partitioned_topic) == f"persistent://t/ns/{base}"


def test_partition_names_round_trip():
    topic = TopicName.parse("non-persistent://t/ns/orders")
    partition = topic.partition(3)
    assert str(partition) == "non-persistent://t/ns/orders-partition-3"
    assert partition.partition_index == 3 and partition.partitioned_topic == topic
    assert TopicName.parse(str(partition)) == partition
    with pytest.raises(ValueError):
        topic.partition(-1)
    with pytest.raises(ValueError):
        topic.partition(2**31)


@pytest.mark.parametrize("bad", [
    "",
    "a/b",                                   # two parts: neither short nor tenant/ns/topic
    "a/b/c/d",                               # four parts without a domain
    "persistent://t/ns",                     # no topic part
    "persistent://t",
    "persistent://",
    "/x", "x/", "a//b", "//x",               # empty parts
    "persistent:///ns/x", "persistent://t//x", "persistent://t/ns/",
    "t/ns/", "/ns/x",
    "bogus://t/ns/x",                        # unknown domains
    "://t/ns/x",
    "http://t/ns/x",
    "persistent:/t/ns/x",                    # no '://': a short name with the wrong number of parts
    "persistent://t!/ns/x",                  # a tenant / namespace outside [-=:.\w]
    "persistent://t/n s/x",
    "persistent://t/ns/ x", "persistent://t/ns/x\n", "persistent://t/ns/x\0y",
    "x" * 1025,
])
def test_malformed_names_are_refused(bad):
    with pytest.raises(InvalidTopicNameError):
        TopicName.parse(bad)
    with pytest.raises(InvalidTopicNameError):
        normalize_topic(bad)


@pytest.mark.parametrize("bad", [None, 3, b"persistent://t/ns/x"])
def test_a_name_is_a_string(bad):
    with pytest.raises(InvalidTopicNameError):
        TopicName.parse(bad)


@pytest.mark.parametrize("v1", [
    "persistent://tenant/cluster/ns/x",
    "non-persistent://tenant/cluster/ns/x",
    "persistent://tenant/cluster/ns/x-partition-1",
    "persistent://tenant/cluster/ns/a/b",
])
def test_v1_names_are_refused_with_a_clear_error(v1):
    """Pulsar reads `domain://tenant/cluster/namespace/topic` as a V1 name (namespace
    tenant/cluster/ns), never as a V2 local name `ns/x`; pyengine has no clusters and says so."""
    with pytest.raises(InvalidTopicNameError, match="V1 topic names .* are not supported"):
        TopicName.parse(v1)


def test_normalized_names_are_cached_and_bad_ones_refused_every_time():
    assert normalize_topic("cached-topic") is normalize_topic("cached-topic")
    for _ in range(2):                      # a refusal is never remembered as an answer
        with pytest.raises(InvalidTopicNameError):
            normalize_topic("persistent://only-tenant")
        with pytest.raises(InvalidTopicNameError, match="string"):
            normalize_topic(["not", "hashable"])
