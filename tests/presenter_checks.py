"""What a projector needs from a page in presenter mode, measured on the drawn page in a real browser.

`MEASURE` reads one drawn page (a page, a tab of it, or a stage) and returns what a room would see
wrong: the main picture below the first screen, an empty band between a chart's title and its plot,
a colour bar whose tick labels overlap, an axis title that is clipped or shortened, text a class must
read under the room's size, faded or cut short. `views` opens every page of the registry, every tab
of the pages with tabs and every stage of the walkthrough, as a presenter steps through them.
"""

from __future__ import annotations

MIN_TEXT_PX = 18  # the smallest text a room reads (tick labels, legends, dropdowns, captions)
MAX_TITLE_GAP_PX = 40  # the most empty space between a chart's title and the top of what it shows

# A page's main picture: the first chart, table or data editor of the main area, after the title.
PICTURE = (
    "[data-testid='stMain'] [data-testid='stPlotlyChart'], [data-testid='stMain'] [data-testid='stDataFrame'], "
    "[data-testid='stMain'] [data-testid='stTable']"
)

# What a plotly chart's legend covers of the chart (``plot``, its .js-plotly-plot element): [what, pixels]
# for its plot area, each x tick label and the x title, where they overlap by more than 2 px each way.
LEGEND_COVERS = r"""plot => {
    const legend = plot.querySelector('.legend');
    if (!legend) return [];
    const l = legend.getBoundingClientRect();
    const parts = [['the plot', plot.querySelector('.nsewdrag')], ['the x title', plot.querySelector('.g-xtitle')],
                   ...[...plot.querySelectorAll('.xtick text')].map(t => [`x label ${t.textContent.trim()}`, t])];
    return parts.filter(([, el]) => el).flatMap(([what, el]) => {
        const a = el.getBoundingClientRect();
        const down = Math.min(a.bottom, l.bottom) - Math.max(a.top, l.top);
        const across = Math.min(a.right, l.right) - Math.max(a.left, l.left);
        return down > 2 && across > 2 ? [[what, Math.round(down)]] : [];
    });
}"""

# One drawn page, measured: {"picture": the main picture's box and name or null, "problems": [...]}.
# ``picture_title`` (a piece of the main picture's title) picks the picture where it is not the first.
MEASURE = r"""([minPx, maxGap, pictureTitle]) => {
    const problems = [];
    const main = document.querySelector("[data-testid='stMain']");
    const box = el => el.getBoundingClientRect();
    // drawn, with a size (a closed expander's content keeps its boxes: checkVisibility says it is hidden)
    const visible = el => { const b = box(el); return b.width > 0 && b.height > 0 && el.checkVisibility(); };
    const overlap = (a, b, slack) =>
        a.left < b.right - slack && b.left < a.right - slack && a.top < b.bottom - slack && b.top < a.bottom - slack;
    const plain = s => {  // plotly's title text as a reader sees it: tags out, entities decoded, spaces as one
        const t = document.createElement('textarea');
        t.innerHTML = String(s || '').replace(/<br\s*\/?>/gi, ' ').replace(/<[^>]*>/g, '');
        return t.value.replace(/\s+/g, ' ').trim();
    };
    const shown = el => plain(el.textContent);

    // the main picture: the first chart or table, or the chart whose title holds pictureTitle
    const pictures = [...document.querySelectorAll(%PICTURE%)].filter(visible);
    pictures.sort((a, b) => box(a).top - box(b).top);  // as drawn: presenter mode moves pictures up
    let picture = pictures[0] || null;
    if (pictureTitle) {
        picture = pictures.find(p => [...p.querySelectorAll('.gtitle')].some(t => t.textContent.includes(pictureTitle)))
            || null;
    }
    const pbox = picture ? box(picture) : null;

    for (const plot of main.querySelectorAll('.js-plotly-plot')) {
        if (!visible(plot)) continue;
        const layout = plot._fullLayout || {};
        const title = plot.querySelector('.gtitle');
        const name = title && title.textContent.trim() ? title.textContent.trim() : '(untitled chart)';
        const chart = box(plot);

        // the band between the title (and its subtitle) and the top of what the chart shows
        if (title && title.textContent.trim()) {
            const heads = [title, ...plot.querySelectorAll('.gtitle-subtitle')].map(box);
            const bottom = Math.max(...heads.map(b => b.bottom));
            const parts = [...plot.querySelectorAll(
                '.nsewdrag, .xtick text, .x2tick text, [class*="xtitle"], .annotation, .legend, .colorbar')]
                .filter(visible).filter(el => box(el).bottom > bottom);
            if (parts.length) {
                const first = parts.reduce((a, b) => box(b).top < box(a).top ? b : a);
                const gap = box(first).top - bottom;
                // what comes first under the band, and the margins plotly laid out: to tell a late redraw
                const m = layout._size || {};
                if (gap > maxGap) problems.push(`${name}: ${Math.round(gap)} px empty between the title and the plot`
                    + ` (then ${first.getAttribute('class')}, ${Math.round(box(first).height)} px high;`
                    + ` top margin ${m.t} px; chart top ${Math.round(chart.top)}, title ${Math.round(box(title).top)}`
                    + `-${Math.round(bottom)}, ${first.getAttribute('class')} from ${Math.round(box(first).top)},`
                    + ` plot area from ${Math.round(chart.top + (m.t || 0))}; fonts ${document.fonts.status})`);
            }
        }

        // the chart's title and subtitle: the whole text inside the chart (plotly draws a title wider than
        // its chart on one line, cut at the chart's edge)
        for (const head of [title, ...plot.querySelectorAll('.gtitle-subtitle')]) {
            if (!head || !head.textContent.trim()) continue;
            const b = box(head);
            if (b.left < chart.left - 1 || b.right > chart.right + 1)
                problems.push(`${name}: the title "${shown(head)}" is cut at the chart's edge`
                              + ` (${Math.round(b.left)}-${Math.round(b.right)} in ${Math.round(chart.left)}`
                              + `-${Math.round(chart.right)})`);
        }

        // the legend off the plot area and the x axis's labels and title
        for (const [what] of (%LEGEND_COVERS%)(plot)) problems.push(`${name}: the legend covers ${what}`);

        // a colour bar's tick labels: each apart from the next
        for (const bar of plot.querySelectorAll('.colorbar')) {
            const labels = [...bar.querySelectorAll('.cbaxis text')].filter(t => visible(t) && t.textContent.trim());
            for (let i = 0; i < labels.length; i++)
                for (let j = i + 1; j < labels.length; j++)
                    if (overlap(box(labels[i]), box(labels[j]), 1))
                        problems.push(`${name}: colour bar labels ${labels[i].textContent} and `
                                      + `${labels[j].textContent} overlap`);
        }

        // every axis title: the whole text, drawn inside the chart
        for (const text of plot.querySelectorAll('.infolayer text[class$="title"]')) {
            const which = [...text.classList].find(c => /^[xy]\d*title$/.test(c));
            if (!which) continue;
            const axis = layout[which.replace(/^([xy])(\d*)title$/, (m, a, n) => `${a}axis${n}`)];
            const wanted = plain(axis && axis.title && axis.title.text);
            if (!wanted) continue;
            if (shown(text).replace(/\s/g, '') !== wanted.replace(/\s/g, ''))  // lines join with no space
                problems.push(`${name}: axis title reads "${shown(text)}", not "${wanted}"`);
            const b = box(text);
            const inside = b.left >= chart.left - 1 && b.right <= chart.right + 1
                && b.top >= chart.top - 1 && b.bottom <= chart.bottom + 1;
            if (!inside)
                problems.push(`${name}: axis title "${wanted}" is cut at the chart's edge`);
            if (b.left < 0 || b.right > window.innerWidth)
                problems.push(`${name}: axis title "${wanted}" is off screen`);
        }
    }

    // a slider's value: clear of its track, its thumb, its label and its end labels
    for (const slider of main.querySelectorAll("[data-testid='stSlider']")) {
        const label = slider.querySelector("[data-testid='stWidgetLabel']");
        for (const value of slider.querySelectorAll("[data-testid='stSliderThumbValue']")) {
            const thumb = value.parentElement, rail = [...thumb.parentElement.children].find(c => c !== thumb);
            const v = box(value.querySelector('p') || value);
            const others = [[box(thumb), 'its thumb'], [box(rail), 'its track']];
            if (label && visible(label)) others.push([box(label), 'its label']);
            for (const end of slider.querySelectorAll("[data-testid='stSliderTickBar'] p"))
                if (visible(end) && parseFloat(getComputedStyle(end).opacity) > 0)
                    others.push([box(end), 'an end label']);
            for (const [b, what] of others)
                if (overlap(v, b, 0.5)) problems.push(`slider value ${value.textContent} runs into ${what}`);
        }
    }

    // text a class must read: every text of the main area (charts included) and every value shown in
    // a field (a dropdown's choice, a number), at least minPx and not faded
    const readable = [];
    const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
    while (walker.nextNode())
        if (walker.currentNode.textContent.replace(/[\s\u200b]/g, '') && walker.currentNode.parentElement)
            readable.push([walker.currentNode.parentElement, walker.currentNode.textContent]);
    for (const field of main.querySelectorAll('input:not([type="checkbox"]):not([type="radio"]), textarea'))
        if (field.value.trim()) readable.push([field, field.value]);
    const seen = new Set();
    for (const [el, text] of readable) {
        if (seen.has(el)) continue;
        seen.add(el);
        // left out: plotly's toolbar and hover boxes, and a button's shortcut (for the presenter, not the room)
        if (!visible(el) || el.closest('.modebar, .hoverlayer, kbd')) continue;
        if (/Material Symbols/.test(getComputedStyle(el).fontFamily)) continue;  // an icon, not text
        const style = getComputedStyle(el);
        if (style.visibility === 'hidden') continue;
        let opacity = 1;
        for (let a = el; a && a !== document.body; a = a.parentElement)
            opacity *= parseFloat(getComputedStyle(a).opacity);
        const colour = (el instanceof SVGElement ? style.fill : style.color).match(/rgba?\(([^)]*)\)/);
        const parts = colour ? colour[1].split(/[ ,/]+/).filter(Boolean) : [];
        if (parts.length === 4) opacity *= parseFloat(parts[3]);
        if (el instanceof SVGElement) opacity *= parseFloat(style.fillOpacity || '1');
        if (opacity < 0.01) continue;  // not drawn at all (a slider's hidden end labels)
        const what = `"${text.trim().slice(0, 40)}"`;
        const px = parseFloat(style.fontSize);
        if (px < minPx - 0.01) problems.push(`${what} is ${px} px`);
        // a control that does nothing here is greyed on purpose, the room's size all the same
        const disabled = el.closest('[disabled], [aria-disabled="true"]');
        if (opacity < 0.99 && !disabled) problems.push(`${what} is faded (opacity ${opacity.toFixed(2)})`);
        // cut short with "…" by a box too narrow for it (a button's label in a narrow column)
        for (let a = el, up = 0; a && a !== main && up < 3; a = a.parentElement, up++)
            if (getComputedStyle(a).textOverflow === 'ellipsis' && a.scrollWidth > a.clientWidth + 1) {
                problems.push(`${what} is cut short`);
                break;
            }
    }

    // a data grid draws its text on a canvas, in the fonts of its theme (CSS variables of the grid)
    for (const grid of main.querySelectorAll('.stDataFrameGlideDataEditor')) {
        if (!visible(grid)) continue;
        const style = getComputedStyle(grid);
        for (const part of ['base', 'header']) {
            const px = parseFloat((style.getPropertyValue(`--gdg-${part}-font-style`).match(/([\d.]+)px/) || [])[1]);
            if (!(px >= minPx - 0.01)) problems.push(`a data grid draws its ${part} text at ${px} px`);
        }
    }

    return {
        picture: pbox && {top: pbox.top, bottom: pbox.bottom, left: pbox.left, right: pbox.right,
                          name: (picture.querySelector('.gtitle') || {}).textContent || picture.dataset.testid},
        problems,
    };
}""".replace("%PICTURE%", repr(PICTURE)).replace("%LEGEND_COVERS%", LEGEND_COVERS)

# The pages whose tabs (or the walkthrough's stages) are stepped through with Shift+Right, as a presenter
# does (their "Next tab" or "Next" button), whatever the links write for a tab or a stage.
NEXT = {"mechanics", "variants", "walkthrough"}
# Where the main picture is not the view's first chart, a piece of its title: the head atlas's head map, and
# the permutation tab's maps of the shuffled sentence (not the table of differences drawn before them).
PICTURE_TITLES = {"atlas": "close when they attend alike", "mechanics: Permutation": "Positional encoding off"}

# What a tab or a stage shows: the open tab's name, or the stage picked in the walkthrough's list.
SHOWN = """() => {
    const tab = document.querySelector("[data-testid='stMain'] [role='tab'][aria-selected='true']");
    if (tab) return tab.textContent.trim();
    const stage = document.querySelector("[data-testid='stMain'] [data-testid='stSelectbox'] input");
    return stage ? stage.value.trim() : '';
}"""


def views(page, url: str, name: str, settled, stages: list[str]):
    """Open page ``name`` at ``url`` in presenter mode and yield a name for each view of it: the page, then each
    of its tabs, or each of the walkthrough's ``stages`` (their titles), reached with the page's Next button."""
    page.goto(f"{url}?present=1")
    settled(page, name)
    if name not in NEXT:
        yield name
        return
    tabs = page.locator("[data-testid='stMain'] [role='tab']").all_inner_texts()
    names = [t.strip() for t in tabs] if name != "walkthrough" else stages
    assert names, f"{name}: no tabs or stages found"
    for i, view in enumerate(names):
        if i:
            # the presenter's key, with no field focused (a field would keep the arrow for its own cursor)
            page.evaluate("() => document.activeElement && document.activeElement.blur()")
            page.keyboard.press("Shift+ArrowRight")
            page.wait_for_function(f"() => ({SHOWN})() === {view!r}", timeout=60_000)
            settled(page, f"{name}: {view}")
        assert page.evaluate(SHOWN) == view, f"{name} shows {page.evaluate(SHOWN)!r}, not {view!r}"
        yield f"{name}: {view}"
