"""PySpark data source and Arrow UDFs that read pyengine topics READ_COMMITTED."""
