// The default Neuroglancer viewer, its state read from the URL fragment.
import "neuroglancer/unstable/main.bundle.js";
