"""ServiceConfig from an injected environment, and API keys (constant-time check, never shown)."""

from __future__ import annotations

import pytest

from ilre.service.common.config import ConfigError, ServiceConfig
from ilre.service.common.keys import ApiKeys


def test_defaults_environment_and_overrides():
    assert ServiceConfig.from_env({}) == ServiceConfig()
    env = {"ILRE_GRPC_PORT": "6000", "ILRE_MAX_WAIT_MS": "2.5", "ILRE_REDIS_URL": "redis://r:6379/1", "ILRE_HOST": ""}
    config = ServiceConfig.from_env(env, grpc_port=7000, max_batch=None)
    assert config.grpc_port == 7000  # the flag wins
    assert config.max_wait_ms == 2.5 and config.redis_url == "redis://r:6379/1"
    assert config.max_batch == 8 and config.host == "127.0.0.1"  # unset / empty = default


@pytest.mark.parametrize("env, overrides, message", [
    ({"ILRE_GRPC_PORT": "fifty"}, {}, "ILRE_GRPC_PORT: must be an integer (got 'fifty')"),
    ({"ILRE_MAX_WAIT_MS": "soon"}, {}, "ILRE_MAX_WAIT_MS: must be a number (got 'soon')"),
    ({}, {"http_port": 70000}, "http_port: must be a port in 0..65535 (got 70000)"),
    ({}, {"max_batch": 0}, "max_batch: must be >= 1 (got 0)"),
    ({}, {"request_timeout_s": 0}, "request_timeout_s: must be > 0"),
    ({"ILRE_HTTP_KEEP_ALIVE_S": "-1"}, {}, "http_keep_alive_s: must be > 0"),
    ({}, {"tls_cert": "a.pem"}, "tls_cert: give both tls_cert and tls_key"),
    ({}, {"tls_client_ca": "ca.pem"}, "tls_client_ca: mutual TLS needs tls_cert and tls_key"),
    ({}, {"redis_url": "localhost:6379"}, "redis_url: must start with redis://"),
    ({"ILRE_API_KEYS_FILE": "/no/such/keys"}, {}, "api_keys_file: cannot read /no/such/keys"),
])
def test_bad_settings_name_the_setting(env, overrides, message):
    with pytest.raises(ConfigError) as err:
        ServiceConfig.from_env(env, **overrides)
    assert message in str(err.value)


def test_api_keys_from_environment_and_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# ops\n  file-key  \n\n#commented-out\n")
    keys = ApiKeys.load({"ILRE_API_KEYS": "env-a, env-b,,"}, str(path))
    assert len(keys) == 3 and keys.enabled
    for good in ("Bearer env-a", "bearer env-b", "Bearer file-key", "  Bearer   file-key "):
        assert keys.check(good), good
    for bad in (None, "", "Bearer", "Bearer ", "env-a", "Basic env-a", "Bearer env-a2", "Bearer #commented-out",
                "Bearer ENV-A"):
        assert not keys.check(bad), bad
    assert "env-a" not in repr(keys) and "file-key" not in repr(ServiceConfig(api_keys=keys))


def test_no_keys_means_authentication_off():
    keys = ApiKeys.load({})
    assert not keys.enabled and keys.check(None) and keys.check("anything")
