"""The generated shop website of the web_shop environment."""
