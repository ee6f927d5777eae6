"""Write a preset's client partition as one image folder per client.

Each client gets ``<out>/client-<id>/train/<class>/<row>.png`` and ``test/...``: the
images exactly as the simulator holds them (resized, RGB, uint8), class subfolders
named by class index, files named by their row so a node reads them in the partition's
order. A Flower SuperNode started with ``--node-config 'data-path="<out>/client-003"'``
then trains on data that lives only on it, and a federation of such nodes can be
compared with the simulator on the same partition (docs/flower.md, "Nodes with their
own data"). ``partition.json`` beside the folders describes the clients (true groups,
class counts) for that comparison; no node or server reads it. With a federated start
and the unlabeled images on the clients (``--set federated.pretraining=fed-simclr --set
partition.unlabeled=iid``, or ``groups``) each client also gets its share of the deal in
``unlabeled/<row>.png``: what a federated pre-training (docs/flower.md) trains on there.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.data.folders import class_folder_names
from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="quick", distribute=False, runs=False)


def client_folder(out: Path, client: int) -> Path:
    return out / f"client-{client:03d}"


def export(clients, out: Path) -> list[Path]:
    """Write every client of ``clients`` (:class:`~cpcfl_tf.clustered.clients.Clients`)
    under ``out``; returns the client folders in client order."""
    from PIL import Image

    names = class_folder_names(clients.num_classes)
    folders = []
    for u in range(clients.train.num_clients):
        folder = client_folder(out, u)
        for split, arrays in (("train", clients.train), ("test", clients.test)):
            for row, (image, label) in enumerate(zip(arrays.images[u], arrays.labels[u])):
                path = folder / split / names[int(label)] / f"{row:05d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(image).save(path)
        folders.append(folder)
    return folders


def export_unlabeled(dealt, out: Path) -> None:
    """Write each client's unlabeled images (``dealt``, in client order) under its
    folder's ``unlabeled/``."""
    from PIL import Image

    for u, images in enumerate(dealt):
        folder = client_folder(out, u) / "unlabeled"
        folder.mkdir(parents=True, exist_ok=True)
        for row, image in enumerate(images):
            Image.fromarray(image).save(folder / f"{row:05d}.png")


def main(argv: Sequence[str] | None = None) -> None:
    args = SCRIPT.parser().parse_args(argv)
    if not args.out:
        raise UserError("give --out DIR: the folder the client folders are written into")
    if Path(args.out).exists() and any(Path(args.out).iterdir()) and not args.force:
        raise UserError(f"{args.out} is not empty; give an empty folder or --force")
    session = SCRIPT.session(args)

    from cpcfl_tf.clustered.clients import clients_for
    from cpcfl_tf.records.files import write_json

    clients = clients_for(session.config)
    folders = export(clients, session.out)
    if session.config.partition.unlabeled != "server":
        from cpcfl_tf.clustered.clients import unlabeled_for

        export_unlabeled(unlabeled_for(session.config), session.out)
    write_json(session.out / "partition.json", {"clients": clients.records})
    print(f"wrote {len(folders)} client folders ({clients.train.size} training, "
          f"{clients.test.size} test images each) to {session.out}", file=sys.stderr)
    for folder in folders:
        print(f"flower-supernode ... --node-config 'data-path={json.dumps(str(folder.resolve()))}'")
    print(f"flwr run . NAME --run-config \"node-data='own' min-nodes={len(folders)} ...\"")


if __name__ == "__main__":
    run_cli(main)
