"""Model folders as ComfyUI users set them up: symlinks to files and folders are followed (a cycle
does not hang the walk), a name is valid when the listing produces it, and request names that are
absolute, contain '..' or are not listed are refused with the messages Loom has always given."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.folder_scan import scan
from engine.folders import KIND_FOLDERS, ModelFolders, ModelPathError, base_directory_layout


def touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """A shared store outside models/: the files and folders that the links below point at."""
    store = tmp_path / "store"
    touch(store / "sd15.safetensors")
    touch(store / "loras" / "style" / "ink.safetensors")
    touch(store / "loras" / "watercolor.safetensors")
    touch(store / "vaes" / "a.safetensors")
    touch(store / "vaes" / "nested" / "b.safetensors")
    touch(store / "blobs" / "3f9a1c")  # a content-addressed blob, as in a hub cache: no suffix
    return store


@pytest.fixture
def models(tmp_path: Path, library: Path) -> ModelFolders:
    root = tmp_path / "models"
    touch(root / "checkpoints" / "local.safetensors")
    (root / "checkpoints" / "linked.safetensors").symlink_to(library / "sd15.safetensors")
    (root / "checkpoints" / "hub.safetensors").symlink_to(library / "blobs" / "3f9a1c")
    (root / "loras").mkdir(parents=True)
    (root / "loras" / "shared").symlink_to(library / "loras", target_is_directory=True)
    (root / "vae").symlink_to(library / "vaes", target_is_directory=True)  # the whole kind folder
    return ModelFolders(root)


# --- symlinks are followed -----------------------------------------------------------------------
def test_links_to_files_and_folders_are_listed(models: ModelFolders) -> None:
    assert models.list("checkpoints") == ["hub.safetensors", "linked.safetensors", "local.safetensors"]
    assert models.list("loras") == ["shared/style/ink.safetensors", "shared/watercolor.safetensors"]
    assert models.list("vae") == ["a.safetensors", "nested/b.safetensors"]


def test_listed_names_resolve_through_links(models: ModelFolders, library: Path) -> None:
    path = models.resolve("loras", "shared/style/ink.safetensors")
    assert path.read_bytes() == b"x" and path.resolve() == library / "loras" / "style" / "ink.safetensors"
    assert (
        models.resolve("vae", "nested/b.safetensors").resolve()
        == library / "vaes" / "nested" / "b.safetensors"
    )
    assert models.resolve("checkpoints", "linked.safetensors").resolve() == library / "sd15.safetensors"


def test_resolved_path_keeps_the_listed_name(models: ModelFolders) -> None:
    # A link to a suffix-less blob keeps its .safetensors name, which loaders read the format from.
    path = models.resolve("checkpoints", "hub.safetensors")
    assert path.name == "hub.safetensors" and path.is_absolute() and path.is_file()


def test_dangling_link_is_not_listed(models: ModelFolders, library: Path) -> None:
    (library / "sd15.safetensors").unlink()
    assert "linked.safetensors" not in models.list("checkpoints")
    with pytest.raises(ModelPathError, match="not found"):
        models.resolve("checkpoints", "linked.safetensors")


def test_a_link_cycle_does_not_hang_the_listing(tmp_path: Path) -> None:
    loras = tmp_path / "models" / "loras"
    touch(loras / "a" / "one.safetensors")
    (loras / "a" / "back").symlink_to(loras, target_is_directory=True)  # loras/a/back -> loras
    (loras / "a" / "self").symlink_to(loras / "a", target_is_directory=True)  # loras/a/self -> loras/a
    (loras / "loop1").symlink_to(loras / "loop2")  # a link loop: neither file nor folder
    (loras / "loop2").symlink_to(loras / "loop1")
    folders = ModelFolders(tmp_path / "models")
    assert folders.list("loras") == ["a/one.safetensors"]


def test_a_mesh_of_folders_linked_to_each_other_is_walked_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 folders, each linking to all the others: a walk of every path through the mesh reads 13,700
    # folders; each folder is walked at most MAX_VISITS times instead.
    import engine.folder_scan as folder_scan

    mesh = [tmp_path / "mesh" / f"m{i}" for i in range(8)]
    for i, folder in enumerate(mesh):
        touch(folder / f"file{i}.safetensors")
    for folder in mesh:
        for other in mesh:
            if other != folder:
                (folder / other.name).symlink_to(other, target_is_directory=True)
    loras = tmp_path / "models" / "loras"
    loras.mkdir(parents=True)
    (loras / "mesh").symlink_to(mesh[0], target_is_directory=True)
    monkeypatch.setattr(folder_scan, "MAX_VISITS", 3)
    listing = folder_scan.scan(loras)
    assert len(listing.stamps) <= 1 + 3 * len(mesh)
    found = {name.rsplit("/", 1)[-1] for name in listing.files}
    assert found == {f"file{i}.safetensors" for i in range(8)}  # every file is still listed
    assert "mesh/m1/file1.safetensors" in listing.files


def test_the_same_folder_linked_twice_is_listed_under_both_names(tmp_path: Path, library: Path) -> None:
    loras = tmp_path / "models" / "loras"
    loras.mkdir(parents=True)
    (loras / "x").symlink_to(library / "loras" / "style", target_is_directory=True)
    (loras / "y").symlink_to(library / "loras" / "style", target_is_directory=True)
    assert ModelFolders(tmp_path / "models").list("loras") == ["x/ink.safetensors", "y/ink.safetensors"]


# --- names from requests ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["../secret.safetensors", "shared/../../secret.safetensors", "shared\\..\\secret.safetensors"]
)
def test_dotdot_names_are_refused(models: ModelFolders, name: str) -> None:
    with pytest.raises(ModelPathError, match=r"must be a path relative to the loras folder, without '\.\.'"):
        models.resolve("loras", name)


@pytest.mark.parametrize("name", ["/etc/passwd", "\\server\\share\\x.safetensors"])
def test_absolute_names_are_refused(models: ModelFolders, library: Path, name: str) -> None:
    with pytest.raises(ModelPathError, match="without '..'"):
        models.resolve("checkpoints", name)
    with pytest.raises(ModelPathError, match="without '..'"):  # even one that the listing reaches
        models.resolve("checkpoints", str(library / "sd15.safetensors"))


def test_unlisted_names_are_refused_even_when_the_file_exists(models: ModelFolders) -> None:
    root = models.models_dir / "checkpoints"
    touch(root / "notes.txt")
    touch(root / ".hidden.safetensors")
    for name in ("notes.txt", ".hidden.safetensors", "nope.safetensors"):
        with pytest.raises(
            ModelPathError,
            match=rf"checkpoints file '{name}' not found \(looked in .*\); "
            r"available: \['hub",
        ):
            models.resolve("checkpoints", name)


def test_empty_kind_says_where_to_put_files(tmp_path: Path) -> None:
    folders = ModelFolders(tmp_path / "models")
    with pytest.raises(ModelPathError, match=r"upscale_models file 'x\.pth' not found .*put the file in"):
        folders.resolve("upscale_models", "x.pth")


# --- kinds and ComfyUI's folder names --------------------------------------------------------------
def test_comfyui_folder_names_and_old_kind_names(tmp_path: Path) -> None:
    root = tmp_path / "models"
    touch(root / "unet" / "flux.safetensors")
    touch(root / "diffusion_models" / "wan.safetensors")
    touch(root / "clip" / "t5.safetensors")
    touch(root / "text_encoders" / "clip_l.safetensors")
    touch(root / "t2i_adapter" / "depth.safetensors")
    folders = ModelFolders(root)
    for kind in ("diffusion_models", "unet"):
        assert folders.list(kind) == ["flux.safetensors", "wan.safetensors"]
        assert folders.resolve(kind, "flux.safetensors") == root / "unet" / "flux.safetensors"
    for kind in ("text_encoders", "clip"):
        assert folders.list(kind) == ["clip_l.safetensors", "t5.safetensors"]
    assert folders.list("controlnet") == ["depth.safetensors"]
    assert folders.folders("unet") == [root / "unet", root / "diffusion_models"]  # ComfyUI's order
    assert {"unet", "clip", "diffusion_models", "text_encoders", "upscale_models"} <= set(folders.kinds())


@pytest.mark.parametrize("kind", sorted(KIND_FOLDERS))
def test_every_kind_follows_a_linked_folder(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "elsewhere" / kind
    name = (
        "pipe/model_index.json"
        if kind == "diffusers"
        else ("c.yaml" if kind == "configs" else "m.safetensors")
    )
    touch(outside / name)
    root = tmp_path / "models"
    root.mkdir()
    (root / KIND_FOLDERS[kind][0]).symlink_to(outside, target_is_directory=True)
    folders = ModelFolders(root)
    listed = "pipe" if kind == "diffusers" else name
    assert folders.list(kind) == [listed]
    assert folders.resolve(kind, listed).resolve() == (outside / listed).resolve()


def test_diffusers_folders_are_entries(tmp_path: Path, library: Path) -> None:
    touch(library / "pipes" / "sd15" / "model_index.json", b"{}")
    touch(library / "pipes" / "sd15" / "unet" / "diffusion_pytorch_model.safetensors")
    root = tmp_path / "models" / "diffusers"
    root.mkdir(parents=True)
    (root / "mine").symlink_to(library / "pipes", target_is_directory=True)
    folders = ModelFolders(tmp_path / "models")
    assert folders.list("diffusers") == ["mine/sd15"]
    assert folders.resolve("diffusers", "mine/sd15").is_dir()


# --- extra_model_paths.yaml in ComfyUI's documented format -------------------------------------------
COMFY_STYLE_YAML = """\
#config for a1111 ui
#all you have to do is change the base_path to where yours is installed
a111:
    base_path: webui/

    checkpoints: models/Stable-diffusion
    configs: models/Stable-diffusion
    vae: models/VAE
    loras: |
         models/Lora
         models/LyCORIS
    upscale_models: |
                  models/ESRGAN
                  models/RealESRGAN
    embeddings: embeddings
    controlnet: models/ControlNet

#config for comfyui
comfyui:
     base_path: ${SHARED_COMFY}
     is_default: true
     checkpoints: models/checkpoints/
     clip: models/clip/
     diffusion_models: |
                  models/diffusion_models
                  models/unet

other_ui:
    checkpoints: relative/to/this/file

empty_section:
"""


@pytest.fixture
def yaml_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelFolders, Path, Path]:
    webui = tmp_path / "cfg" / "webui" / "models"
    touch(webui / "Stable-diffusion" / "sub" / "x.safetensors")
    touch(webui / "Stable-diffusion" / "x.yaml")
    touch(webui / "Lora" / "a.safetensors")
    touch(webui / "LyCORIS" / "b.safetensors")
    touch(webui / "RealESRGAN" / "4x.pth")
    comfy = tmp_path / "comfy"
    touch(comfy / "models" / "checkpoints" / "x.safetensors")  # the same name: is_default wins
    touch(comfy / "models" / "clip" / "t5.safetensors")
    touch(comfy / "models" / "unet" / "flux.safetensors")
    monkeypatch.setenv("SHARED_COMFY", str(comfy))
    cfg = tmp_path / "cfg" / "extra_model_paths.yaml"
    cfg.write_text(COMFY_STYLE_YAML)
    folders = ModelFolders(tmp_path / "models")
    folders.add_yaml(cfg)
    return folders, webui, comfy


def test_yaml_sections_base_path_and_multiline_paths(yaml_setup: tuple[ModelFolders, Path, Path]) -> None:
    folders, webui, comfy = yaml_setup
    assert folders.list("loras") == ["a.safetensors", "b.safetensors"]
    assert folders.list("upscale_models") == ["4x.pth"]
    assert folders.list("configs") == ["x.yaml"]
    assert folders.list("text_encoders") == ["t5.safetensors"]  # 'clip:' is text_encoders
    assert folders.list("diffusion_models") == ["flux.safetensors"]
    assert folders.folders("loras")[1:] == [webui / "Lora", webui / "LyCORIS"]
    assert folders.folders("embeddings")[-1] == webui.parent / "embeddings"  # base_path + line
    assert folders.folders("checkpoints")[-1] == webui.parents[1] / "relative" / "to" / "this" / "file"


def test_yaml_is_default_folders_come_first(yaml_setup: tuple[ModelFolders, Path, Path]) -> None:
    folders, webui, comfy = yaml_setup
    assert folders.folders("checkpoints")[0] == comfy / "models" / "checkpoints"
    assert (
        folders.resolve("checkpoints", "x.safetensors") == comfy / "models" / "checkpoints" / "x.safetensors"
    )
    assert folders.list("checkpoints") == ["sub/x.safetensors", "x.safetensors"]
    assert folders.resolve("checkpoints", "sub/x.safetensors").parent.parent == webui / "Stable-diffusion"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: [1, 2]\n", "section 'a' must be a mapping"),
        ("a:\n  loras: 3\n", r"a\.loras: expected a folder or a block of folders"),
        ("- x\n", "expected a mapping of sections"),
        ("a: {b: [\n", "cannot read model paths config"),
    ],
)
def test_bad_yaml_says_what_is_wrong(tmp_path: Path, text: str, expected: str) -> None:
    cfg = tmp_path / "extra_model_paths.yaml"
    cfg.write_text(text)
    with pytest.raises(ModelPathError, match=expected):
        ModelFolders(tmp_path / "models").add_yaml(cfg)


def test_add_folder_twice_keeps_one_entry(tmp_path: Path) -> None:
    folders = ModelFolders(tmp_path / "models")
    folders.add_folder("loras", tmp_path / "a")
    folders.add_folder("loras", tmp_path / "a/")
    folders.add_folder("loras", tmp_path / "a", is_default=True)  # moves it to the front
    assert folders.folders("loras") == [tmp_path / "a", tmp_path / "models" / "loras"]
    folders.add_folder("loras", tmp_path / "b")
    folders.add_folder("loras", tmp_path / "a")  # known: keeps its place, as in ComfyUI
    assert folders.configured("loras") == [tmp_path / "a", tmp_path / "b"]


def test_base_directory_layout_is_comfyuis(tmp_path: Path) -> None:
    layout = base_directory_layout(tmp_path / "base")
    assert layout == {
        name: tmp_path / "base" / name
        for name in ("models", "input", "output", "temp", "user", "custom_nodes")
    }


def test_scan_of_a_missing_or_file_root_lists_nothing(tmp_path: Path) -> None:
    assert scan(tmp_path / "absent").files == ()
    assert scan(touch(tmp_path / "file.safetensors")).files == ()
