#!/usr/bin/env bash
# Builds Neuroglancer's default viewer into <repo>/.neuroglancer/ (gitignored), the static site
# NDStore serves at /neuroglancer/, so the landing page's "View in Neuroglancer" links work with
# no internet access.
#
# The `neuroglancer` npm package ships compiled ES modules but no app: Vite bundles them here
# (vite.config.js says why it needs two small plugins). Everything comes from the npm registry,
# pinned by package-lock.json; Neuroglancer's GitHub-pinned `ikonate` dependency is overridden with
# the registry's release. Install scripts are not run (none is needed for the build).
#
# Idempotent: does nothing when .neuroglancer/ was built from these same files. Installs Node.js
# and npm with apt-get when they are missing. NDSTORE_NEUROGLANCER_DIR overrides the destination.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
dest=${NDSTORE_NEUROGLANCER_DIR:-$root/.neuroglancer}
sources=(package.json package-lock.json vite.config.js index.html main.js install.sh)
stamp=$(cd "$here" && sha256sum "${sources[@]}" | sha256sum | cut -d' ' -f1)

if [ -f "$dest/index.html" ] && [ "$(cat "$dest/.build-stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "neuroglancer: $dest is up to date"
    exit 0
fi

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "neuroglancer: installing nodejs and npm with apt-get"
    sudo=$([ "$(id -u)" = 0 ] || echo sudo)
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q nodejs npm
fi
# Vite 6 runs on Node.js 18 (Debian 12's) and later.
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
    echo "neuroglancer: Node.js >= 18 is needed, found $(node --version)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work" "$dest.new"' EXIT
(cd "$here" && cp "${sources[@]}" "$work/")
started=$(date +%s)
(
    cd "$work"
    # `npm install` keeps the locked versions; unlike `npm ci` it tolerates a registry mirror that
    # lacks some other platform's optional packages (rollup's, esbuild's native builds).
    npm install --ignore-scripts --no-audit --no-fund --loglevel=error
    NG_OUT_DIR="$work/dist" npx --no-install vite build
)
echo "$stamp" > "$work/dist/.build-stamp"
rm -rf "$dest.new"
mv "$work/dist" "$dest.new"
rm -rf "$dest"
mv "$dest.new" "$dest"
echo "neuroglancer: built $dest ($(du -sh "$dest" | cut -f1)) in $(( $(date +%s) - started )) s"
