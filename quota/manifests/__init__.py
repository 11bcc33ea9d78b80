"""Files of manifests read into snapshots: the documents any such file holds, and the cluster
file of `muster fairshare` / `muster admit`."""
