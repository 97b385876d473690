"""A deleted private channel leaves nothing that a later channel of the same name could read,
even one that gets the same id (a metadata database restored from a backup, or one that reuses
ids): not the time samples and levels its experiment was lowered past, not an object whose index
entry was lost. The attacker is the next admin of the experiment, and anyone who can list the
store. On main the purge walked only the levels and times declared at the delete, through the
index only: the old voxels at t=3 and level 4, and the object with no index entry, were served
to the new channel."""

from __future__ import annotations

import numpy as np
from rest_framework.test import APIClient

from tests.api.conftest import client_for, make_dataset
from tests.api.test_channel_purge import DECLARED, LOWERED, OCTET, channel_prefix, leftovers, write_everywhere


def test_a_deleted_private_channel_leaves_nothing_a_later_one_of_its_name_and_id_reads(admin: APIClient) -> None:
    from django.contrib.auth.models import User

    from ndstore.api.lookups import channel_volume
    from ndstore.api.models import Channel, Grant
    from ndstore.wiring import services

    ds = make_dataset(admin, "priv", frame=(600, 600, 32), levels=5, times=4, channels={"secret": "uint8"})
    base = write_everywhere(admin, ds, "secret")
    declared = ds.cutout("secret", 0, (0, 64), (0, 64), (0, 8), direct=True)
    assert admin.post(declared, np.full((8, 64, 64), 200, np.uint8).tobytes(), content_type=OCTET).status_code == 201
    old = Channel.objects.get(name="secret")
    prefix = channel_prefix("priv", "secret")
    unindexed = channel_volume(old).volume_key(0, 0).supercuboid(0)
    assert unindexed.object_key in leftovers(prefix)["objects"]
    services().index.index.delete_many([unindexed])  # an index entry lost; its object stays

    experiment = "/v1/collection/priv/experiment/e1/"
    assert admin.put(experiment, LOWERED, format="json").status_code == 200
    assert admin.delete("/v1/collection/priv/experiment/e1/channel/secret/").status_code == 204

    # the next admin of the experiment makes a channel of the same name, and it gets the same id
    bob = User.objects.create(username="bob")
    Grant.objects.create(user=bob, collection=old.experiment.collection, level="admin")
    Channel.objects.create(id=old.id, experiment=old.experiment, name="secret", type="image", datatype="uint8",
                           creator=bob)
    assert channel_prefix("priv", "secret") == prefix
    as_bob = client_for(bob)
    assert as_bob.put(experiment, DECLARED, format="json").status_code == 200
    for url in [*base, declared]:
        r = as_bob.get(url, HTTP_ACCEPT=OCTET)
        assert r.status_code == 200 and not np.frombuffer(r.content, np.uint8).any(), url
    assert leftovers(prefix) == {"objects": [], "index": [], "cache": [], "blaze": []}  # nor anyone listing the store
