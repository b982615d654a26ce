"""A drawing pad: a plain 2D canvas in a gr.HTML that sends one small PNG when the pen lifts.

Gradio's Sketchpad draws on WebGL and reads its canvas back (`readPixels`) twice per stroke before it
sends the drawing: in a browser without a GPU that took most of the 1.46 s from the pen's lift to the
answer on this project's 2-core machine. This pad draws with the 2D canvas API and, when a stroke ends,
encodes the canvas once (`toDataURL`) and fires one `input` event whose value is the drawing as a PNG
data URL: black ink on a transparent canvas, ink in alpha (the API reads either), white paper by CSS
whatever the theme. Undo and Clear redraw the strokes kept in the page, each with the pen it was drawn
with; emptied, the pad fires `clear` with no value. The pens are round, of the radii the page offers (a
button each, drawn as its dot); a choice holds until another, Clear included. Mouse, pen and touch alike
(pointer events; the canvas does not scroll the page).
"""

import base64

import gradio as gr

PNG_DATA_URL = "data:image/png;base64,"

HTML = """
<div class="pad">
  <span class="label">${label}</span>
  <div class="bar">
    <span class="pens" role="group" aria-label="Pen"></span>
    <button type="button" class="undo" aria-label="Undo" title="Undo the last stroke" disabled>↶ Undo</button>
    <button type="button" class="clear" aria-label="Clear canvas" title="Clear the canvas" disabled>✕ Clear</button>
  </div>
  <canvas width="${size}" height="${size}" aria-label="${label}: a canvas to draw on"></canvas>
</div>
"""

CSS = """
.pad { display: flex; flex-direction: column; gap: 6px; }
.bar { display: flex; align-items: center; gap: 6px; }
.label { font-size: var(--block-label-text-size); color: var(--block-label-text-color); }
.bar button { padding: 2px 10px; border-radius: var(--radius-sm); border: 1px solid var(--border-color-primary);
              background: var(--button-secondary-background-fill); color: var(--button-secondary-text-color); }
.bar button:disabled { opacity: 0.4; }
.pens { flex: 1; display: flex; gap: 4px; }
.pens button { width: 30px; height: 30px; padding: 0; display: grid; place-items: center; }
.pens button[aria-pressed="true"] { border-color: var(--color-accent);
                                    box-shadow: inset 0 0 0 1px var(--color-accent); }
.pens i { display: block; border-radius: 50%; background: currentColor; }
canvas { width: 100%; max-width: ${size}px; aspect-ratio: 1; align-self: center; background: white;
         border: 1px solid var(--border-color-primary); border-radius: var(--radius-sm);
         touch-action: none; cursor: crosshair; }
"""

# Strokes are kept as their pen's radius and canvas points; a segment is drawn as the pointer moves, and the
# whole drawing is redrawn only on Undo. Coordinates are scaled from the canvas's CSS box to its pixels. A pen's
# button shows its dot to scale with the others', the broadest 22 px across.
JS = """
const canvas = element.querySelector('canvas');
const undo = element.querySelector('.undo'), clear = element.querySelector('.clear');
const pens = element.querySelector('.pens');
const pen = canvas.getContext('2d');
const strokes = [];
let stroke = null, radius = props.pens[props.pen];

for (const [name, r] of Object.entries(props.pens)) {
    const button = document.createElement('button');
    button.type = 'button';
    button.setAttribute('aria-label', `${name} pen`);
    button.setAttribute('aria-pressed', String(name === props.pen));
    button.title = `Draw with the ${name} pen`;
    const dot = document.createElement('i');
    dot.style.width = dot.style.height = `${Math.max(3, 22 * r / Math.max(...Object.values(props.pens)))}px`;
    button.append(dot);
    button.addEventListener('click', () => {
        radius = r;
        pens.querySelectorAll('button').forEach(b => b.setAttribute('aria-pressed', String(b === button)));
    });
    pens.append(button);
}

const at = (event) => {
    const box = canvas.getBoundingClientRect();
    return [(event.clientX - box.left) * canvas.width / box.width,
            (event.clientY - box.top) * canvas.height / box.height];
};
const dot = ([x, y], r) => { pen.beginPath(); pen.arc(x, y, r, 0, 2 * Math.PI); pen.fill(); };
const line = (a, b) => { pen.beginPath(); pen.moveTo(...a); pen.lineTo(...b); pen.stroke(); };
const trace = ({r, points}) => {
    pen.lineWidth = 2 * r;
    dot(points[0], r);
    points.slice(1).forEach((p, k) => line(points[k], p));
};
const paint = () => { pen.clearRect(0, 0, canvas.width, canvas.height); strokes.forEach(trace); };
const send = () => {
    undo.disabled = clear.disabled = strokes.length === 0;
    props.value = strokes.length ? canvas.toDataURL('image/png') : null;
    trigger(strokes.length ? 'input' : 'clear');
};

pen.fillStyle = pen.strokeStyle = '#000';
pen.lineCap = pen.lineJoin = 'round';
canvas.addEventListener('pointerdown', (event) => {
    if (event.button !== 0) return;
    canvas.setPointerCapture(event.pointerId);
    stroke = {r: radius, points: [at(event)]};
    strokes.push(stroke);
    trace(stroke);
});
canvas.addEventListener('pointermove', (event) => {
    if (!stroke) return;
    const points = stroke.points;
    for (const e of event.getCoalescedEvents ? event.getCoalescedEvents() : [event]) {
        const p = at(e);
        line(points[points.length - 1], p);
        points.push(p);
    }
});
const lift = () => { if (stroke) { stroke = null; send(); } };
canvas.addEventListener('pointerup', lift);
canvas.addEventListener('pointercancel', lift);
undo.addEventListener('click', () => { strokes.pop(); paint(); send(); });
clear.addEventListener('click', () => { strokes.length = 0; paint(); send(); });
"""


def drawing_pad(label: str, elem_id: str, size: int, pens: dict[str, int], pen: str) -> gr.HTML:
    """A `size` px square pad drawn with round pens, `pens` their names and radii (px of the canvas), `pen`
    the one in hand at first; its value is a PNG data URL (None when empty), its events `input` (a stroke
    ended, or one was undone) and `clear`."""
    if pen not in pens:
        raise ValueError(f"the pen in hand, {pen!r}, is not one of the pad's: {', '.join(pens)}")
    return gr.HTML(
        value=None,
        html_template=HTML,
        css_template=CSS,
        js_on_load=JS,
        label=label,
        elem_id=elem_id,
        elem_classes="pad",
        size=size,
        pens=pens,
        pen=pen,
    )


def drawing_png(drawing: str | None) -> bytes | None:
    """The pad's drawing as PNG bytes, None if nothing is drawn; ValueError if it is not a PNG data URL."""
    if not drawing:
        return None
    if not drawing.startswith(PNG_DATA_URL):
        raise ValueError("not a PNG data URL")
    return base64.b64decode(drawing[len(PNG_DATA_URL) :], validate=True)
