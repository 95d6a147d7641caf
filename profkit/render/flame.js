(function () {
  var svg = document.getElementById('flame');
  var row = +svg.getAttribute('data-row'), pad = +svg.getAttribute('data-pad');
  var width = +svg.getAttribute('width');
  var frames = Array.prototype.slice.call(document.querySelectorAll('g.frame'));
  var byId = {};
  var maxDepth = 0;
  frames.forEach(function (g) {
    byId[g.id] = g; maxDepth = Math.max(maxDepth, +g.getAttribute('data-depth'));
  });
  function place(g, x, w) {
    var depth = +g.getAttribute('data-depth');
    var y = pad + (maxDepth - depth) * row;
    var rect = g.querySelector('rect'), text = g.querySelector('text');
    rect.setAttribute('x', x); rect.setAttribute('width', Math.max(0, w));
    rect.setAttribute('y', y); text.setAttribute('x', x + 3); text.setAttribute('y', y + row - 5);
    var name = g.getAttribute('data-name');
    var fit = Math.floor((w - 6) / 6.6);
    text.textContent = fit < 3 ? '' : (name.length > fit ? name.slice(0, fit - 2) + '..' : name);
  }
  function isUnder(g, ancestor) {
    for (var p = g; p; p = byId[p.getAttribute('data-parent')]) { if (p === ancestor) return true; }
    return false;
  }
  function zoom(target) {
    var x0 = target ? +target.getAttribute('data-x') : 0;
    var w0 = target ? +target.getAttribute('data-w') : width;
    var scale = width / w0;
    frames.forEach(function (g) {
      var x = +g.getAttribute('data-x'), w = +g.getAttribute('data-w');
      var visible = !target || isUnder(g, target) || isUnder(target, g);
      g.classList.toggle('hidden', !visible);
      if (!visible) return;
      if (target && isUnder(target, g) && g !== target) { place(g, 0, width); return; }
      place(g, (x - x0) * scale, w * scale);
    });
  }
  function search(term) {
    var re = term ? new RegExp(term.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'i') : null;
    var matched = 0, seconds = 0, total = 0;
    frames.forEach(function (g) {
      var hit = !!re && re.test(g.getAttribute('data-name'));
      g.classList.toggle('match', hit);
      if (!g.getAttribute('data-parent')) total += +g.getAttribute('data-seconds');
      if (hit) {
        matched += 1;
        var p = byId[g.getAttribute('data-parent')], counted = false;
        for (; p; p = byId[p.getAttribute('data-parent')]) {
          if (p.classList.contains('match')) { counted = true; break; }
        }
        if (!counted) seconds += +g.getAttribute('data-seconds');
      }
    });
    document.getElementById('matched').textContent = re ?
      ('matched ' + matched + ' frames, ' + (100 * seconds / (total || 1)).toFixed(1) + '%') : ' ';
    return matched;
  }
  frames.forEach(function (g) {
    g.addEventListener('click', function () { zoom(g); });
    g.addEventListener('mouseover', function () {
      document.getElementById('details').textContent = g.querySelector('title').textContent;
    });
  });
  document.getElementById('reset-button').addEventListener('click', function () { zoom(null); });
  document.getElementById('search-button').addEventListener('click', function () {
    var term = window.prompt('Search frames (regular text):', '');
    if (term !== null) search(term);
  });
  window.profkitSearch = search;
  window.profkitZoom = function (id) { zoom(id ? byId[id] : null); };
  zoom(null);
})();
