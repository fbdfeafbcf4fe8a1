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

/** Whether the strings of agent JSON are strings (agents send anything). */
export const isString = (v) => typeof v === 'string';

/** `v` if it is a string, else ''. */
export const str = (v) => (isString(v) ? v : '');

/** Whether a scrolled `log` shows its end (within 80 px): then what grows below stays in view. */
export const atEnd = (log) => !!log && log.scrollHeight - log.scrollTop - log.clientHeight < 80;

/** Runs `fn` at the next frame, or in 100 ms where no frame comes (a background tab): `fn` must
 *  tolerate the second call. */
export function soon(fn) {
  requestAnimationFrame(fn);
  setTimeout(fn, 100);
}
