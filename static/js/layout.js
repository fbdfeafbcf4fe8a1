// The sidebar: a column beside the conversation on wide screens (which the toggle can hide), a
// drawer over it on narrow ones (style.css, max-width 760px). An open drawer behaves like a modal
// dialog: focus moves into it, Escape or the scrim or its close button closes it, focus goes back
// to where it was, and the rest of the app is inert meanwhile. A closed drawer is
// visibility: hidden (style.css), so it is out of the tab order and the accessibility tree.

const COLLAPSED_KEY = 'acp-gateway.sidebar-collapsed';
const narrow = window.matchMedia('(max-width: 760px)');

let ui = null;
/** Where focus was when the drawer opened. */
let returnTo = null;

/** @param elements {app, sidebar, toggle, scrim, close, inertWhenOpen: Element[]} */
export function initLayout(elements) {
  ui = elements;
  ui.toggle.addEventListener('click', toggleSidebar);
  ui.scrim.addEventListener('click', () => closeSidebar());
  ui.close?.addEventListener('click', () => closeSidebar());
  ui.sidebar.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && isDrawerOpen()) {
      event.preventDefault();
      event.stopPropagation();
      closeSidebar();
    }
  });
  narrow.addEventListener('change', () => {
    // A drawer left open when the window widens is just the sidebar: no longer modal.
    ui.app.classList.remove('sidebar-open');
    setInert(false);
    render();
  });
  if (localStorage.getItem(COLLAPSED_KEY) === '1') ui.app.classList.add('sidebar-collapsed');
  render();
}

export const isNarrow = () => narrow.matches;
export const isDrawerOpen = () => narrow.matches && ui?.app.classList.contains('sidebar-open');

/** Whether the session list is on screen (a wide sidebar not hidden, or an open drawer). */
export function sidebarShown() {
  if (!ui) return false;
  return narrow.matches ? ui.app.classList.contains('sidebar-open') : !ui.app.classList.contains('sidebar-collapsed');
}

/** Shows or hides the session list (the drawer on narrow screens, the column on wide ones). */
export function setSidebar(open) {
  if (!ui) return;
  if (!narrow.matches) {
    ui.app.classList.toggle('sidebar-collapsed', !open);
    localStorage.setItem(COLLAPSED_KEY, open ? '0' : '1');
    render();
    return;
  }
  const wasOpen = ui.app.classList.contains('sidebar-open');
  if (open === wasOpen) return;
  ui.app.classList.toggle('sidebar-open', open);
  setInert(open);
  render();
  if (open) {
    const active = document.activeElement;
    returnTo = active && active !== document.body ? active : ui.toggle;
    // The close button first: focusing a text field would pop up a phone's keyboard.
    (ui.close ?? ui.sidebar).focus({ preventScroll: true });
  } else if (ui.sidebar.contains(document.activeElement) || document.activeElement === document.body) {
    const target = returnTo?.isConnected ? returnTo : ui.toggle;
    returnTo = null;
    target.focus({ preventScroll: true });
  }
}

export function closeSidebar() {
  if (narrow.matches) setSidebar(false);
}

export function toggleSidebar() {
  setSidebar(!sidebarShown());
}

function setInert(on) {
  for (const el of ui.inertWhenOpen) el.inert = on;
}

function render() {
  const shown = sidebarShown();
  ui.toggle.setAttribute('aria-expanded', String(shown));
  ui.toggle.setAttribute('aria-label', shown ? 'Hide sessions' : 'Show sessions');
  ui.scrim.hidden = !(narrow.matches && shown);
}
