// One message bubble in the conversation: the user's prompt, the agent's answer, or its thoughts.
// Text chunks stream into a MarkdownStream; other content blocks (images, resource links…) are
// placed between text segments in arrival order. Thoughts sit in a <details> that is open with
// "Thinking…" while they stream and closes to "Thought for Ns" once anything else follows.

import { contentBlock } from './content.js';
import { atEnd, el, soon } from './dom.js';
import { MarkdownStream } from './markdown.js';

/** A message that got no text for this long is re-rendered as finished (see MarkdownStream.polish). */
const QUIET_MS = 1500;

/**
 * Settles all of `stream` over as many frames as it takes (a long message replayed at once would
 * otherwise be one long task), keeping the conversation scrolled to the end if it was.
 */
function settle(stream, root) {
  if (!stream.render({ final: true })) return;
  let pending = false;
  const step = () => {
    if (!pending) return;
    pending = false;
    const log = root.parentElement;
    const stick = atEnd(log);
    const more = stream.render({ final: true });
    if (stick) log.scrollTop = log.scrollHeight;
    if (more) next();
  };
  const next = () => {
    pending = true;
    soon(step);
  };
  next();
}

export class Message {
  /**
   * @param kind {'user'|'agent'|'thought'}
   * @param speaker {string} the accessible heading of the bubble
   */
  constructor(kind, speaker) {
    this.kind = kind;
    this.body = el('div', { class: 'msg-body md-body', testid: `message-${kind}` });
    this.stream = null; // the text segment being written; a content block starts a new one
    this.quiet = null; // timer for polish()
    if (kind === 'thought') {
      this.started = performance.now();
      this.touched = false; // the user opened or closed it: leave it as they want it
      this.summary = el('summary', { class: 'thought-summary', testid: 'thought-summary', text: 'Thinking…' });
      this.summary.addEventListener('click', () => { this.touched = true; });
      this.root = el('details', { class: 'msg msg-thought', testid: 'thought', open: true }, this.summary, this.body);
    } else {
      this.root = el('article', { class: `msg msg-${kind}` },
        el('h3', { class: 'visually-hidden', text: speaker }), this.body);
    }
  }

  /** Adds streamed Markdown text (drawn on the next render()). */
  write(text) {
    if (!text) return;
    if (!this.stream) {
      const part = el('div', { class: 'md' });
      this.body.append(part);
      this.stream = new MarkdownStream(part);
    }
    this.stream.push(text);
  }

  /** Adds a non-text ACP content block after the text so far. */
  block(content) {
    if (this.stream) settle(this.stream, this.root);
    this.stream = null;
    this.body.append(contentBlock(content));
  }

  /** Text arrived that is not drawn yet. */
  get dirty() { return !!this.stream?.dirty; }

  /** Draws what arrived; true when part of it was left for a later frame (see MarkdownStream.render). */
  render() {
    if (!this.stream?.dirty) return false;
    let later;
    try {
      later = this.stream.render();
    } catch (err) {
      // A bug here must not stop every later update of the session from rendering: show this
      // segment as plain text and carry on with a fresh one.
      console.error('message render failed', err);
      this.stream.abandon();
      this.stream = null;
      return false;
    }
    clearTimeout(this.quiet);
    const stream = this.stream;
    this.quiet = setTimeout(() => stream.polish(), QUIET_MS);
    return later;
  }

  /** The message is over (something else follows it): settle all of it, fold a thought away. */
  finish() {
    clearTimeout(this.quiet);
    if (this.stream) settle(this.stream, this.root);
    if (this.kind === 'thought' && !this.finished) {
      const seconds = Math.round((performance.now() - this.started) / 1000);
      this.summary.textContent = seconds >= 1 ? `Thought for ${seconds}s` : 'Thought';
      if (!this.touched) this.root.open = false;
    }
    this.finished = true;
  }
}
