"""`startPosition` / `endPosition` as a JSON object per topic: a topic given twice is refused,
naming the option, and so is JSON nested too deeply. Found by an audit: `{"a": "1:2",
"public/default/a": "3:4"}` (one topic, two spellings, or one key twice) silently read from
3:4, and deeply nested JSON ended in a RecursionError instead of an OptionError."""

from __future__ import annotations

import pytest

from spark_udfs.options import OptionError, parse_options


@pytest.mark.parametrize("option", ["startPosition", "endPosition"])
@pytest.mark.parametrize(("value", "message"), [
    ('{"a": "1:2", "a": "3:4"}', "names 'a' twice"),
    ('{"a": "1:2", "public/default/a": "3:4"}', "names persistent://public/default/a twice"),
    ('{"persistent://public/default/a": "1:2", "a": "1:2"}', "names persistent://public/default/a twice"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
])
def test_a_topic_given_twice_or_deep_json_is_an_option_error(option, value, message):
    with pytest.raises(OptionError, match=f"^{option}.*{message}"):
        parse_options({"path": "/data", option: value})


def test_distinct_topics_are_kept():
    spec = parse_options({"path": "/data", "startPosition": '{"a": "1:2", "b": "earliest"}'}).start
    assert {name: str(p) for name, p in spec.per_topic.items()} == {
        "persistent://public/default/a": "1:2", "persistent://public/default/b": "earliest"}
