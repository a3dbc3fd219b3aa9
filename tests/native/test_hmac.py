import hashlib
import hmac

import pytest
from hora import _native


@pytest.mark.parametrize("key_len", [0, 1, 32, 64, 65, 200])
@pytest.mark.parametrize("msg_len", [0, 1, 55, 56, 63, 64, 65, 1000])
def test_hmac_matches_python(key_len: int, msg_len: int) -> None:
    key = bytes(range(key_len % 256)) * (key_len // 256 + 1)
    key = key[:key_len]
    message = bytes((7 * i) % 256 for i in range(msg_len))
    assert _native.hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).digest()
