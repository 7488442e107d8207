"""The README's Spark example runs as written, in this test session's Spark session."""

from tests.docs.test_readme import readme_example


def test_spark_example_prints_the_committed_messages(spark, capsys):
    exec(compile(readme_example("spark"), "README.md:spark", "exec"), {"__name__": "readme_example"})
    assert capsys.readouterr().out.splitlines() == ["[b'committed', b'plain']", "2 of 5"]
