// Builds Neuroglancer's default viewer (the `neuroglancer` npm package, which ships compiled
// ES modules but no app) into a static site with relative URLs, so it can be served under any
// path prefix. Run by install.sh; NG_OUT_DIR names the output folder.
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { defineConfig } from "vite";

const require = createRequire(import.meta.url);
const ikonateIcons = join(dirname(require.resolve("ikonate/package.json")), "icons");

// Neuroglancer pins ikonate to a GitHub commit; package.json overrides it with the npm release,
// which lacks these three icons. Each is drawn with the nearest icon that release has.
const iconStandIns = { "code-alt.svg": "edit.svg", "controls-alt.svg": "controls.svg", "layers.svg": "stack.svg" };

function ikonateStandIns() {
  return {
    name: "ikonate-stand-ins",
    enforce: "pre",
    resolveId(source) {
      const match = /^ikonate\/icons\/([^?]+)(\?.*)?$/.exec(source);
      if (match === null || existsSync(join(ikonateIcons, match[1]))) return null;
      return join(ikonateIcons, iconStandIns[match[1]] ?? "placeholder.svg") + (match[2] ?? "");
    },
  };
}

// Neuroglancer puts a webpack hint comment between `new Worker(` and `new URL(..., import.meta.url)`.
// Without it Vite recognises the pattern and bundles the chunk worker and the async-computation
// worker (and the wasm decoders they fetch) as module workers.
function stripWorkerHints() {
  return {
    name: "strip-webpack-worker-hints",
    transform(code, id) {
      if (!id.includes("/neuroglancer/lib/") || !code.includes("webpackChunkName")) return null;
      return { code: code.replace(/\/\*\s*webpackChunkName:[^*]*\*\//g, ""), map: null };
    },
  };
}

// Worker bundles get their own plugin list: the async-computation worker is started from the chunk worker.
const plugins = () => [ikonateStandIns(), stripWorkerHints()];

export default defineConfig({
  base: "./",
  plugins: plugins(),
  worker: { format: "es", plugins },
  build: {
    target: "esnext",
    outDir: process.env.NG_OUT_DIR ?? "dist",
    emptyOutDir: true,
    chunkSizeWarningLimit: 8192,
  },
  logLevel: "warn",
});
