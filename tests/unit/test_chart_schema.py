"""The chart's values.schema.json checks the names, labels and annotations it
writes into objects in the forms shoal's CRD uses (shoal.schema.names): one
definition of each form, so `helm install` refuses what the API server would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shoal.schema.names import (
    IMAGE,
    IMAGE_DIGEST,
    IMAGE_ID,
    IMAGE_REPOSITORY,
    LABEL_VALUE,
    OBJECT_NAME,
    QUALIFIED_NAME,
    SUBDOMAIN_MAX,
)

SCHEMA = Path(__file__).resolve().parents[2] / "charts" / "shoal" / "values.schema.json"


def definitions() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(SCHEMA.read_text())["definitions"]
    return found


def test_object_names_and_label_values_are_shoals_forms() -> None:
    found = definitions()
    for name, form in (("objectName", OBJECT_NAME), ("labelValue", LABEL_VALUE)):
        assert found[name]["pattern"] == f"^{form.pattern}$", name
        assert found[name]["maxLength"] == form.max_length, name


def test_label_and_annotation_keys_are_shoals_form() -> None:
    for name in ("labels", "annotations"):
        first, *_ = definitions()[name]["patternProperties"]
        assert first == f"^{QUALIFIED_NAME.pattern}$"
        assert definitions()[name]["additionalProperties"] is False


def test_label_and_annotation_key_prefixes_are_bounded_as_shoals_are() -> None:
    # The key pattern bounds only the name after the '/'; the prefix is a DNS
    # subdomain, so a key with a longer one matches a pattern that admits nothing.
    found = definitions()
    assert found["longKeyPrefix"]["not"] == {}
    for name in ("labels", "annotations"):
        refused = found[name]["patternProperties"][f"^[^/]{{{SUBDOMAIN_MAX + 1},}}/"]
        assert refused == {"$ref": "#/definitions/longKeyPrefix"}


def test_images_are_shoals_form() -> None:
    # The chart's images (operator and routers) and a VLLMCluster's spec.image.
    found = definitions()
    assert found["image"]["pattern"] == f"^{IMAGE.pattern}$"
    assert found["image"]["not"] == {"pattern": f"^{IMAGE_ID}$"}
    assert found["image"]["maxLength"] == found["imageRepository"]["maxLength"] == IMAGE.max_length
    assert found["imageRepository"]["pattern"] == f"^{IMAGE_REPOSITORY}$"
    assert f"(@{IMAGE_DIGEST})?" in found["imageTag"]["pattern"]
