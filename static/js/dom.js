// The web UI's element builder (app.js and every module in static/js).
// Text goes in through textContent, never through HTML.

/** Builds an element. Props: class, testid, text, on<event>, booleans as properties, rest as attributes. */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value == null) continue;
    if (key === 'class') node.className = value;
    else if (key === 'testid') node.dataset.testid = value;
    else if (key === 'text') node.textContent = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (typeof value === 'boolean') node[key] = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) if (child != null) node.append(child);
  return node;
}

/** The element with this id. */
export const $ = (id) => document.getElementById(id);
