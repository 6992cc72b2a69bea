"""spec.image on the real API server beside the kubelet's own image parser
(hack/imageref: distribution/reference, as the kubelet parses an image before
it pulls) and shoal's Python twin:

- admission and `shoal plan` agree on every image, and a refusal names
  spec.image;
- nothing admitted is an image the kubelet cannot parse (which would reach
  the fleet as InvalidImageName, its rollout taken back);
- nothing the kubelet can parse is refused, within the form's bound.

Images are drawn from the form's own pattern, from images users write, and
from either with a few characters edited (a capital, a stray ':', '@' or '/',
a space), so both sides of the grammar get examples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from shoal.schema.names import IMAGE
from shoal_testbed.cluster import Testbed
from tests.e2e.kube import namespace
from tests.e2e.operator_env import cluster_manifest, install_crd
from tests.e2e.test_generated_specs import Server
from tests.e2e.test_generated_values import build_imageref, image_refusal
from tests.unit.test_image_form import ADMITTED, REFUSED

pytestmark = pytest.mark.e2e

# Characters an edit puts in: the grammar's own and some it never takes.
EDITS = "aZ09:/@._-[]+ \té"


@pytest.fixture(scope="module")
def judges(
    testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, Path]]:
    work = tmp_path_factory.mktemp("imageref")
    imageref = build_imageref(work / "imageref")
    install_crd(testbed)
    with namespace(testbed, "images") as ns:
        yield Server(testbed, ns), imageref


@st.composite
def images(draw: st.DrawFn) -> str:
    image = draw(
        st.one_of(
            st.from_regex(IMAGE.pattern, fullmatch=True),
            st.sampled_from(ADMITTED + REFUSED),
        )
    )
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(image)))
        edit = draw(st.sampled_from(("insert", "replace", "delete")))
        char = draw(st.sampled_from(EDITS))
        if edit == "insert":
            image = image[:at] + char + image[at:]
        elif edit == "replace":
            image = image[:at] + char + image[at + 1 :]
        else:
            image = image[:at] + image[at + 1 :]
    return image


@settings(max_examples=300, deadline=None, derandomize=True)
@given(image=images())
@example(image="vllm/VLLM-openai")
@example(image="[088]/vllm")
@example(image="0" * 64)
def test_admission_shoal_and_the_kubelet_agree_on_images(
    judges: tuple[Server, Path], image: str
) -> None:
    server, imageref = judges
    refused = server.refusal(cluster_manifest("images", image=image))
    admitted = refused is None
    event("admitted" if admitted else "refused")
    assert admitted == IMAGE.holds(image), f"{image!r}: API server {refused!r}"
    within = len(image) <= IMAGE.max_length
    if refused is not None:
        saying = "[registry[:port]/]path" if within else f"may not be more than {IMAGE.max_length}"
        assert "spec.image" in refused and saying in refused, refused
    parsed = image_refusal(imageref, image)
    assert not admitted or not parsed, f"{image!r} admitted, the kubelet refuses it: {parsed}"
    assert admitted or parsed or not within, f"{image!r} refused, the kubelet takes it"
