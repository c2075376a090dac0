"""The Hub probe honours the standard proxy and offline variables: with a proxy set, the probe goes to the
proxy the Hugging Face libraries would use (a raw socket to the Hub cannot pass a proxy-only network);
NO_PROXY exempts hosts; offline mode probes nothing."""

import pytest

from common import hub

PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
              "no_proxy", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture
def env(monkeypatch):
    for v in PROXY_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


@pytest.mark.parametrize("setting, target", [
    ({}, ("huggingface.co", 443)),
    ({"HTTPS_PROXY": "http://proxy.corp:3128"}, ("proxy.corp", 3128)),
    ({"https_proxy": "proxy.corp:8080"}, ("proxy.corp", 8080)),
    ({"ALL_PROXY": "socks5://s.corp"}, ("s.corp", 1080)),
    ({"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "localhost,.huggingface.co"}, ("huggingface.co", 443)),
    ({"HTTPS_PROXY": "http://proxy.corp:3128", "no_proxy": "*"}, ("huggingface.co", 443)),
    ({"HTTP_PROXY": "http://p:1"}, ("huggingface.co", 443)),  # an http proxy does not carry https
    ({"HF_ENDPOINT": "http://mirror.lan:8000", "HTTP_PROXY": "http://p:3128"}, ("p", 3128)),
])
def test_the_probe_goes_where_the_libraries_would_connect(env, setting, target):
    for k, v in setting.items():
        env.setenv(k, v)
    assert hub.probe_target() == target


def test_an_unreachable_proxy_fails_fast_in_one_line(env):
    seen = []

    def connect(address, timeout):
        seen.append(address)
        raise OSError("refused")

    env.setenv("HTTPS_PROXY", "http://proxy.corp:3128")
    env.setattr(hub.socket, "create_connection", connect)
    with pytest.raises(hub.HubUnavailable, match="cannot reach the Hugging Face Hub"):
        hub.hub_call("dataset 'x'", lambda: pytest.fail("called the Hub"))
    assert seen == [("proxy.corp", 3128)]


def test_offline_mode_probes_nothing(env):
    env.setenv("HF_HUB_OFFLINE", "1")
    env.setattr(hub.socket, "create_connection", lambda *a, **k: pytest.fail("probed the network offline"))
    assert hub.hub_call("dataset 'x'", lambda: 7) == 7
