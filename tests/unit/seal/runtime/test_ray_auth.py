"""Ray's token authentication from the cluster config: multinode turns it on,
joining a cluster without its token is refused before anything starts, and
the driver's Ray sees the mode (no Ray cluster is started here)."""

from __future__ import annotations

import pytest

from seal.cluster_config import ClusterConfig
from seal.config import compose, instantiate
from seal.runtime.placement import _apply_ray_auth, ray_auth_env, ray_token_source

JOIN = ClusterConfig(address="auto", ray_auth="token")


def test_multinode_turns_token_auth_on_and_local_leaves_it_off():
    assert instantiate(compose(["cluster=multinode"]).cluster).ray_auth == "token"
    assert instantiate(compose([]).cluster).ray_auth == "disabled"
    with pytest.raises(ValueError, match="cluster.ray_auth must be one of disabled, token"):
        ClusterConfig(ray_auth="tokens")


def test_disabled_keeps_what_the_environment_says(tmp_path):
    assert ray_auth_env(ClusterConfig(), {}, tmp_path) == {"RAY_AUTH_MODE": "disabled"}
    assert ray_auth_env(ClusterConfig(), {"RAY_AUTH_MODE": "token"}, tmp_path) == {}


def test_joining_with_token_auth_needs_the_clusters_token(tmp_path):
    with pytest.raises(ValueError, match="no token is here"):
        ray_auth_env(JOIN, {}, tmp_path)
    assert ray_auth_env(JOIN, {"RAY_AUTH_TOKEN": "abc"}, tmp_path) == {"RAY_AUTH_MODE": "token"}
    token_file = tmp_path / "token"
    with pytest.raises(ValueError, match="no token is here"):  # the file RAY_AUTH_TOKEN_PATH names is missing
        ray_auth_env(JOIN, {"RAY_AUTH_TOKEN_PATH": str(token_file)}, tmp_path)
    token_file.write_text("abc\n")
    assert ray_token_source({"RAY_AUTH_TOKEN_PATH": str(token_file)}, tmp_path) == f"RAY_AUTH_TOKEN_PATH={token_file}"
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc")  # what `ray get-auth-token --generate` writes
    assert ray_auth_env(JOIN, {}, tmp_path) == {"RAY_AUTH_MODE": "token"}
    # A local start makes its own token; a contrary RAY_AUTH_MODE is refused, never overridden.
    assert ray_auth_env(ClusterConfig(ray_auth="token"), {}, tmp_path / "nobody") == {"RAY_AUTH_MODE": "token"}
    with pytest.raises(ValueError, match="RAY_AUTH_MODE=disabled in the environment"):
        ray_auth_env(JOIN, {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "abc"}, tmp_path)


def test_the_drivers_ray_sees_token_mode(monkeypatch):
    from ray._raylet import AuthenticationMode, Config, get_authentication_mode

    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    try:
        _apply_ray_auth(JOIN)  # what start_ray does before ray.init
        assert get_authentication_mode() == AuthenticationMode.TOKEN
    finally:
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        Config.initialize("")  # the rest of this process runs as before
    assert get_authentication_mode() == AuthenticationMode.DISABLED
